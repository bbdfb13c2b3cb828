"""The step's all-reduce of the gradient: MPI through host memory (the course's scheme) or NCCL on
the GPUs (trainer/gpu/nccl.py), whichever ``gpu.comm`` and the node's GPUs give."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from trainer.errors import ConfigError
from trainer.ranks import sigterm
from trainer.ranks.parallel import WAIT_POLL_S, World

# A step's gradient sum: ranks in step meet within its time (9 ms for hidden=2048 on a CPU); a peer
# that a signal ended makes it wait for good, asleep after this.
STEP_SPIN_S = 0.1
# How long a rank that a SIGTERM reached still waits for its peers at a gradient sum: ranks that all
# arrived meet within microseconds, and a rank that came must not be left in the sum alone.
ARRIVE_S = 2.0


class HostAllreduce:
    """Sum a flat buffer over all ranks with MPI through host memory (the course's scheme).

    On the GPU the buffer is staged through a pinned host copy: the MPI here is not CUDA-aware.
    The sum is MPI's blocking one, entered once every rank has come (:func:`_all_arrived`).
    """

    def __init__(self, world: World, xp: Any, n: int, dtype: Any) -> None:
        from mpi4py import MPI

        self.comm, self.size, self.in_place = world.comm, world.size, MPI.IN_PLACE
        self.xp, self.dtype = xp, dtype
        self.on_gpu = xp is not np
        self.via = "mpi" if self.on_gpu else "host"  # how the sums go (trainer/core/flops.py COMMS)
        self.overlaps, self.window_state = False, None  # no sum beside the step, no window
        self.capturable = self.size == 1  # a host MPI call in a CUDA graph would run at its capture, not its replays
        self.host = None
        if self.on_gpu and self.size > 1:
            import cupyx

            self.host = cupyx.empty_pinned((n,), dtype=dtype)

    def empty(self, n: int) -> Any:
        """The gradient buffer the step fills and this sums (every all-reduce gives its own)."""
        return self.xp.empty(n, dtype=self.dtype)

    def __call__(self, buf: Any) -> None:
        if self.size == 1:
            return
        if self.on_gpu:
            buf.get(out=self.host)  # waits for the stream: the gradient is complete
        with sigterm.deferred():  # a SIGTERM from here on is raised once the sum is done or abandoned
            arrived = _all_arrived(self.comm)
            if arrived:
                self.comm.Allreduce(self.in_place, self.host if self.on_gpu else buf)
        if not arrived:  # a SIGTERM came, and a peer never did: not a sum, the run's end
            sigterm.check()
        if self.on_gpu:
            buf.set(self.host)


def _all_arrived(comm: Any) -> bool:
    """Wait, awake to SIGTERM, until every rank has come to this sum: True, and the blocking sum
    that follows cannot wait for a rank that is gone. False where a SIGTERM came and a peer did not
    within ARRIVE_S (a stop ended it first). A rank inside MPI's blocking call runs no Python
    signal handler: one that a scancel caught there waited for a peer already ended, until Slurm's
    SIGKILL, and its run was never recorded KILLED. MPI's nonblocking sum would need no barrier, but
    Open MPI's takes 1.3-2x the blocking one's time (docs/benchmarks.md, "The gradient sum")."""
    request = comm.Ibarrier()
    spin_until = time.perf_counter() + STEP_SPIN_S
    give_up = None
    while not request.Test():
        now = time.perf_counter()
        if sigterm.seen():
            give_up = give_up or now + ARRIVE_S
            if now > give_up:
                return False
        if now > spin_until:
            time.sleep(WAIT_POLL_S)
    return True


def make_allreduce(
    comm: str,
    world: World,
    on_gpu: bool,
    n_gpus: int,
    xp: Any,
    n: int,
    dtype: Any,
    beside_gemm: bool = False,
    window: bool = False,
) -> Any:
    """comm=auto: NCCL on GPUs when every rank of this node has a GPU of its own, else MPI.
    ``beside_gemm``: NCCL's sums will run beside the step's GEMMs (fewer blocks); ``window``:
    NCCL sums buffers of a symmetric memory window (trainer/gpu/nccl.py NcclAllreduce). The
    result's ``via`` says how it sums: nccl, mpi (staged through host memory) or host."""
    own_gpu = on_gpu and n_gpus >= world.local_size
    if comm == "nccl" and not own_gpu:
        raise ConfigError(
            f"gpu.comm=nccl needs one GPU per rank ({world.local_size} ranks on this node, {n_gpus} GPUs); "
            "use gpu.comm=mpi or gpu.comm=auto"
        )
    if world.size > 1 and (comm == "nccl" or (comm == "auto" and own_gpu)):
        from trainer.gpu.nccl import NcclAllreduce

        key = (id(world.comm), np.dtype(dtype).str, beside_gemm, window)
        if key not in _NCCL:  # a collective call: every rank of the world asks for the same key
            _NCCL[key] = NcclAllreduce(world, dtype, beside_gemm, window)
        return _NCCL[key]
    return HostAllreduce(world, xp, n, dtype)


# A warm worker's points share one NCCL communicator per world and options (built once: its
# set-up is a collective of hundreds of milliseconds, and NCCL keeps each one's resources).
_NCCL: dict[tuple, Any] = {}
