"""A warm worker's hold on its GPUs while it trains a point, so that workers can share GPUs.

The local runner starts the workers of every shape at once (their start-up, seconds of imports,
CUDA contexts and NCCL, overlaps), several on one GPU; only training is exclusive. Before each
point the ranks take a file lock per GPU (``SWEEPSCALE_GPU_LOCKS`` names the folder) all or
nothing: a world that cannot have all its GPUs holds none and retries, so a nproc=2 worker never
sits on one GPU while a nproc=1 worker waits for it. The locks go when the point has trained
(its run may still wait for the CPU reference: that needs no GPU).
"""

from __future__ import annotations

import fcntl
import os
import random
import time
from pathlib import Path
from typing import Any

ENV = "SWEEPSCALE_GPU_LOCKS"
RETRY_S = (0.005, 0.02)  # a random pause between tries, so that two waiting worlds do not keep colliding


def gpu_id(local_rank: int) -> str:
    """The GPU a rank uses (trainer/backend.py: local_rank mod the visible GPUs), as the machine names it."""
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[local_rank % len(visible)].strip() if visible else str(local_rank)


class GpuLease:
    """Take with :meth:`acquire` (every rank of the world calls it), give back with :meth:`release`."""

    def __init__(self, folder: str | Path, local_rank: int) -> None:
        self.path = Path(folder) / f"gpu{gpu_id(local_rank)}.lock"
        self.fd: int | None = None

    def _try(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def acquire(self, comm: Any) -> float:
        """Block until every rank of ``comm`` holds its GPU; the seconds waited."""
        t0 = time.perf_counter()
        while True:
            mine = self._try()
            if comm.allreduce(int(mine), op=_min()) == 1:
                return time.perf_counter() - t0
            if mine:
                self.release()
            time.sleep(random.uniform(*RETRY_S))

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the lock
            self.fd = None


def from_env(local_rank: int) -> GpuLease | None:
    """The lease when the runner shares GPUs between workers, else None (the GPUs are the job's alone)."""
    folder = os.environ.get(ENV)
    return GpuLease(folder, local_rank) if folder else None


def _min() -> Any:
    from mpi4py import MPI

    return MPI.MIN
