"""The timing protocol (trainer/core/timing.py), pure: warm-up, the floor, repeats and their interval,
and the all-reduce split into the sum itself and the wait for the slowest rank."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from trainer.core.timing import Protocol, blocks, measure, split_sum
from trainer.ranks.backend import bind_near, cpu_list


def test_warm_up_is_the_first_epoch_and_at_least_the_warmup_batches():
    p = Protocol(warmup=2)
    assert p.skipped(19) == 19 and p.skipped(1) == 2


def test_the_floor_counts_batches_and_seconds_for_every_repeat():
    p = Protocol(repeats=3, min_batches=10, min_seconds=0.05)
    assert p.needed(10.0) == 30  # 10 ms a batch: 10 batches make 0.1 s
    assert p.needed(0.05) == 3 * 1000  # 50 us a batch: 0.05 s takes 1000
    assert p.enough([10.0] * 30) and not p.enough([10.0] * 29)
    assert not p.enough([1.0] * 100)  # 100 batches, but 0.1 s of the 0.15 s
    assert p.enough([1.0] * 151)


def test_repeats_are_consecutive_runs_of_nearly_equal_size():
    assert blocks(10, 3) == [slice(0, 4), slice(4, 7), slice(7, 10)]
    assert blocks(2, 3) == [slice(0, 1), slice(1, 2)]  # never an empty repeat
    assert blocks(5, 1) == [slice(0, 5)]


def test_the_median_of_repeats_and_their_range():
    """A slow burst in the middle third moves one repeat, not the point's median."""
    batch = [1.0] * 10 + [3.0] * 10 + [1.1] * 10
    m = measure({"batch": batch, "forward": [0.5] * 30}, repeats=3, extra=30)
    assert m.repeats == [1.0, 3.0, 1.1] and m.batch_ms == 1.1 and m.interval == (1.0, 3.0)
    assert (m.batches, m.extra) == (30, 30) and m.phases["forward"] == 0.5
    assert m.quartiles["q1"]["batch"] == pytest.approx(1.0) and m.quartiles["q3"]["batch"] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="no timed batch"):
        measure({"batch": []}, repeats=3)


def test_the_sum_is_the_last_arrivers_all_reduce_and_the_rest_is_waiting():
    """Rank 1 arrives last at batch 0 (rank 0 waits 0.3 ms), rank 0 at batch 1 (rank 1 waits)."""
    allreduce = np.array([[0.34, 0.04], [0.04, 0.24]])  # ranks x batches
    parts = split_sum(allreduce)
    np.testing.assert_allclose(parts["sum"], [0.04, 0.04])
    np.testing.assert_allclose(parts["wait"], [0.30, 0.0])
    np.testing.assert_allclose(parts["skew"], [0.30, 0.20])
    np.testing.assert_allclose(parts["sum"] + parts["wait"], allreduce[0])  # rank 0's phase, whole


def test_cpu_lists_and_a_gpu_linux_does_not_place_binds_nothing():
    assert cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert bind_near("0000:ff:1f.7") is None  # no such device: nothing said, nothing bound


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_a_rank_binds_to_its_devices_cores_within_those_it_may_use():
    """A real PCI device's NUMA cores: a process allowed one core keeps it (nothing nearer to take)."""
    devices = [
        d for d in os.listdir("/sys/bus/pci/devices") if os.path.exists(f"/sys/bus/pci/devices/{d}/local_cpulist")
    ]
    if not devices:
        pytest.skip("this machine's sysfs lists no PCI device with its local CPUs")
    code = (
        "import os, sys; from trainer.ranks.backend import bind_near; "
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); before = os.sched_getaffinity(0); "
        "print(bind_near(sys.argv[1]), os.sched_getaffinity(0) == before)"
    )
    out = subprocess.run([sys.executable, "-c", code, devices[0]], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["None", "True"], out.stderr
