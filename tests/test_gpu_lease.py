"""GPU leases (trainer/gpu_lease.py): workers sharing GPUs train one at a time on each, and a world
of several ranks takes all its GPUs or none. File locks and real MPI ranks; no GPU is needed."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import MPIEXEC
from trainer.gpu_lease import GpuLease, gpu_id

pytestmark = pytest.mark.mpi

WORLD = """
import sys, time
from trainer import parallel
from trainer.gpu_lease import GpuLease
world = parallel.join_world(2)
lease = GpuLease(sys.argv[1], world.local_rank)
waited = lease.acquire(world.comm)
print(f"rank {world.rank} holds gpu after {waited:.2f} s", flush=True)
lease.release()
"""


def hold(path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def free_now(path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # drops the lock if taken


def test_gpu_id_follows_the_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert [gpu_id(r) for r in range(3)] == ["2", "3", "2"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_id(1) == "1"


def test_a_world_of_two_takes_both_gpus_or_neither(tmp_path):
    # GPU 1 is busy (another worker trains on it): the 2-rank world waits, and meanwhile its rank
    # 0 must not sit on GPU 0, which a nproc=1 worker could use.
    busy = hold(tmp_path / "gpu1.lock")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-c", WORLD, str(tmp_path)]
    world = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        time.sleep(2)  # the ranks start and try
        assert world.poll() is None, world.communicate()[0]
        probes = []
        for _ in range(50):
            probes.append(free_now(tmp_path / "gpu0.lock"))
            time.sleep(0.01)
        assert sum(probes) > 25, probes  # free most of the time: taken only for each try
    finally:
        os.close(busy)  # GPU 1 is free: the world gets both
    out, _ = world.communicate(timeout=30)
    assert world.returncode == 0, out
    assert out.count("holds gpu") == 2, out


def test_one_rank_waits_for_the_gpu_and_gets_it_when_freed(tmp_path):
    from mpi4py import MPI

    first, second = GpuLease(tmp_path, 0), GpuLease(tmp_path, 0)
    first.acquire(MPI.COMM_SELF)
    waited: list[float] = []
    t = threading.Thread(target=lambda: waited.append(second.acquire(MPI.COMM_SELF)))
    t.start()
    time.sleep(0.3)
    assert t.is_alive() and not waited  # the GPU is held: the second worker waits
    first.release()
    t.join(timeout=10)
    assert waited and waited[0] >= 0.3
    second.release()
    assert free_now(tmp_path / "gpu0.lock")
