"""Leases (trainer/ranks/lease.py): workers sharing GPUs or cores train one at a time on each, and a world
of several ranks takes all its units or none. File locks and real MPI ranks; no GPU is needed."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import MPIEXEC
from trainer.ranks import lease
from trainer.ranks.lease import Lease

pytestmark = pytest.mark.mpi

WORLD = """
import sys, time
from trainer.ranks import lease, parallel
world = parallel.join_world(2)
mine = lease.from_env(world.local_rank)
waited = mine.acquire(world.comm)
print(f"rank {world.rank} holds {mine.unit} after {waited:.2f} s", flush=True)
mine.release()
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


def test_each_rank_leases_the_unit_its_runner_named(monkeypatch, tmp_path):
    monkeypatch.setenv(lease.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(lease.UNITS_ENV, "gpu2,gpu3")
    assert [lease.from_env(r).unit for r in range(2)] == ["gpu2", "gpu3"]
    assert lease.from_env(0).on_gpu and lease.from_env(0).path == tmp_path / "gpu2.lock"
    monkeypatch.setenv(lease.UNITS_ENV, "core4")
    assert not lease.from_env(0).on_gpu
    monkeypatch.delenv(lease.DIR_ENV)
    assert lease.from_env(0) is None  # units of the job's own: nothing to lease


def test_a_world_of_two_takes_both_gpus_or_neither(tmp_path):
    # GPU 1 is busy (another worker trains on it): the 2-rank world waits, and meanwhile its rank
    # 0 must not sit on GPU 0, which a nproc=1 worker could use.
    busy = hold(tmp_path / "gpu1.lock")
    env = {**os.environ, **lease.units_env(tmp_path, ["gpu0", "gpu1"])}
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

    first, second = Lease(tmp_path, "gpu0"), Lease(tmp_path, "gpu0")
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
