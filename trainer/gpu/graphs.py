"""The fused step's phases replayed as CUDA graphs: the step's launches out of the CPU's way.

A fused step queues about ten launches and library calls (two cuBLAS GEMMs, three or four kernels,
a memset, NCCL's sum), each costing the CPU tens of microseconds in Python, CuPy and the driver:
at B=3200 the CPU's time to queue a step (0.19-0.44 ms) exceeded the GPU's (0.18 ms), so the GPU
waited for its launches and any host jitter became the measured time (docs/benchmarks.md).

:class:`GraphedStep` captures each phase of each batch (forward, backward, the sum, the update)
once as a CUDA graph and then replays it: one launch a phase. The phases stay apart so that the
loop's clock still records an event between them (trainer/core/clock.py). A phase is captured the
second time it is called with the same operands (addresses, shapes and scalars); the first call
runs as it is (cuBLAS picks its algorithms, NCCL connects, the kernels load), so a run's first
epoch runs uncaptured, as warm-up. Graphs replay the same kernels with the same arguments: the
weights are the eager step's, up to the order of the hidden gradient's atomics (as between two
eager runs).

Only batches whose operands stay where they are can be replayed: the fused step without the
overlap (its sums on a side stream, its update left to the next forward), on X prepared once (no
shuffling), its sums NCCL's (a host-staged MPI sum would run once, at the capture).
``trainer/gpu/policy.py`` ``graph_wanted`` and the all-reduce's ``capturable`` say when; anything
else runs eagerly.
The step must run on a stream other than the legacy default one (CUDA captures no work there):
the run trains under :func:`compute_stream`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

WARM_CALLS = 1  # uncaptured calls of each phase and batch before its capture


def compute_stream() -> Any:
    """A stream of this process's current device to train on (capturable; blocking, so the work
    others queue on the default stream stays ordered with it)."""
    import cupy

    return cupy.cuda.Stream(non_blocking=False)


def where(a: Any) -> tuple:
    """What a graph bakes in of an operand: its addresses and shape (a PreparedX: its three arrays').
    A call with the same addresses and shapes is the captured one, whatever the memory now holds."""
    if hasattr(a, "xt"):  # trainer/gpu/operands.py PreparedX
        return (*where(a.x), *where(a.xcat), *where(a.xt))
    return (a.data.ptr, a.shape, a.strides)


class GraphedStep:
    """A FusedStep whose forward, backward, reduce and update replay CUDA graphs, one per phase and
    batch, captured on their second call with the same operands; every other call and attribute is
    the step's own (prepare, finish, zero_gradient, ...)."""

    def __init__(self, step: Any) -> None:
        import cupy

        self.step, self.cupy = step, cupy
        self.graphs: dict[tuple, Any] = {}
        self.calls: dict[tuple, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.step, name)

    def forward(self, x: Any, y: Any) -> None:
        self._replay(("forward", *where(x), *where(y)), lambda: self.step.forward(x, y))

    def backward(self, x: Any, y: Any, scale: float) -> None:
        self._replay(("backward", *where(x), *where(y), scale), lambda: self.step.backward(x, y, scale))

    def reduce(self) -> None:
        self._replay(("reduce",), self.step.reduce)

    def update(self, lr: float, reg: float, inv_batch: float, loss_out: Any) -> None:
        key = ("update", lr, reg, inv_batch, *where(loss_out))
        self._replay(key, lambda: self.step.update(lr, reg, inv_batch, loss_out))

    @property
    def captured(self) -> int:
        """Graphs captured so far."""
        return len(self.graphs)

    def _replay(self, key: tuple, call: Callable[[], None]) -> None:
        stream = self.cupy.cuda.get_current_stream()
        graph = self.graphs.get(key)
        if graph is None:
            seen = self.calls.get(key, 0)
            if seen < WARM_CALLS or stream.ptr == 0:  # warming up, or on the legacy stream: no capture there
                self.calls[key] = seen + 1
                call()
                return
            # Relaxed (CuPy's default): other threads (MLflow, the reference) may call CUDA meanwhile.
            stream.begin_capture()
            try:
                call()
            finally:
                graph = stream.end_capture()
            self.graphs[key] = graph
        graph.launch(stream)
