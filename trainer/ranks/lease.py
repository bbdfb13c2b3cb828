"""A warm worker's hold on its GPUs or CPU cores while it trains a point, so that workers can share them.

The local runner starts the workers of every shape at once (their start-up, seconds of imports,
MPI, CUDA contexts and NCCL, overlaps), several on one GPU or core; only training is exclusive.
The runner names each worker's units (``SWEEPSCALE_LEASE``: ``gpu0,gpu1`` or ``core2,core3``,
one per local rank) and the folder of their locks (``SWEEPSCALE_LEASE_DIR``). Before each point
the ranks take a file lock per unit all or nothing: a world that cannot have all its units holds
none and retries, so a nproc=2 worker never sits on one GPU while a nproc=1 worker waits for it.
The locks go when the point has trained (on a GPU its run's check may still compute: that needs
no GPU; on CPU cores a worker keeps them until the check has landed, which takes cores).
"""

from __future__ import annotations

import fcntl
import os
import random
import time
from pathlib import Path
from typing import Any

from trainer.ranks import parallel

DIR_ENV, UNITS_ENV = "SWEEPSCALE_LEASE_DIR", "SWEEPSCALE_LEASE"
RETRY_S = (0.005, 0.02)  # a random pause between tries, so that two waiting worlds do not keep colliding


class Lease:
    """Take with :meth:`acquire` (every rank of the world calls it), give back with :meth:`release`."""

    def __init__(self, folder: str | Path, unit: str, holds: bool = True) -> None:
        """``holds``: False for a rank beyond its world's units (ranks sharing cores,
        launcher.oversubscribe): its world's first ranks hold them all, it takes no lock."""
        self.unit, self.holds = unit, holds
        self.path = Path(folder) / f"{unit}.lock"
        self.fd: int | None = None

    @property
    def on_gpu(self) -> bool:
        return self.unit.startswith("gpu")

    def _try(self) -> bool:
        if not self.holds:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def acquire(self, comm: Any) -> float:
        """Block until every rank of ``comm`` holds its unit; the seconds waited."""
        t0 = time.perf_counter()
        while True:
            mine = self._try()
            if parallel.agree(comm, int(mine), "min") == 1:  # a rank that slept longer: the others wait asleep
                return time.perf_counter() - t0
            if mine:
                self.release()
            time.sleep(random.uniform(*RETRY_S))

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the lock
            self.fd = None


def units_env(folder: str | Path, units: list[str]) -> dict[str, str]:
    """What a worker's environment says of its units (the runner's side)."""
    return {DIR_ENV: str(folder), UNITS_ENV: ",".join(units)}


def from_env(local_rank: int) -> Lease | None:
    """This rank's lease where the runner shares units between workers, else None (they are the job's alone)."""
    folder, units = os.environ.get(DIR_ENV), os.environ.get(UNITS_ENV, "").split(",")
    if not folder or not units[0]:
        return None
    return Lease(folder, units[local_rank % len(units)], holds=local_rank < len(units))
