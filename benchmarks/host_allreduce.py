"""The step's gradient sum through host memory: MPI's blocking Allreduce alone, HostAllreduce
(trainer/ranks/allreduce.py: a barrier awake to SIGTERM, then the blocking Allreduce), and MPI's
nonblocking Iallreduce tested until done (docs/benchmarks.md, "The gradient sum").

    mpiexec -n 2 python benchmarks/host_allreduce.py

Buffers of the model's size (784*H + H + 10*H + 10 values) for H in 16 .. 2048, float32 and
float64. Prints, per buffer, the best of 5 repeats of the mean time of one sum, in microseconds, and the
last two's ratios to the first.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from mpi4py import MPI

from trainer.ranks import allreduce, parallel

REPEATS = 5


def timed(calls: list, buf: np.ndarray, comm: MPI.Comm, sums: int) -> list[float]:
    """Each call's best mean over REPEATS, the calls taking turns (a drift of the machine hits both)."""
    best = [float("inf")] * len(calls)
    for _ in range(REPEATS):
        for i, call in enumerate(calls):
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(sums):
                call(buf)
            best[i] = min(best[i], comm.allreduce(time.perf_counter() - t, op=MPI.MAX) / sums)
    return [b * 1e6 for b in best]


def main() -> None:
    comm = MPI.COMM_WORLD
    world = parallel.World(comm, comm.Get_rank(), comm.Get_size(), 0, 1, MPI.Get_library_version()[:40])
    if world.rank == 0:
        print(f"{world.size} ranks, {world.library.splitlines()[0]}")
        print(f"{'H':>5} {'values':>8} {'dtype':>7} {'Allreduce':>9} {'HostAllreduce':>14} {'Iallreduce':>12} (us)")
    for hidden in (16, 128, 512, 1024, 2048):
        n = 784 * hidden + hidden + 10 * hidden + 10
        sums = max(20, int(2e8 // (n * 8 * world.size)))  # about the same bytes per buffer
        for dtype in (np.float32, np.float64):
            buf = np.ones(n, dtype)
            awake = allreduce.HostAllreduce(world, np, n, dtype)

            def blocking(b: np.ndarray) -> None:
                comm.Allreduce(MPI.IN_PLACE, b)

            def nonblocking(b: np.ndarray) -> None:
                request = comm.Iallreduce(MPI.IN_PLACE, b)
                while not request.Test():
                    pass

            t_block, t_host, t_nb = timed([blocking, awake, nonblocking], buf, comm, sums)
            if world.rank == 0:
                row = f"{hidden:>5} {n:>8} {np.dtype(dtype).name:>7} {t_block:>9.0f} {t_host:>14.0f} {t_nb:>12.0f}"
                print(f"{row} {t_host / t_block:>6.2f} {t_nb / t_block:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
