"""The generic SGD step: model.py's functions, NumPy or CuPy, one array op per kernel. The readable
reference, and what the CPU ranks and the sequential check run (the fused GPU step,
trainer/gpu/fused_step.py, has the same five calls). trainer/core/loop.py makes them in order: forward,
backward (or zero_gradient for a rank without rows), reduce, update, and finish at the end of an
epoch.
"""

from __future__ import annotations

from typing import Any, Protocol

from trainer.core import model


class AllReduce(Protocol):
    """What a step asks of an all-reduce (trainer/ranks/allreduce.py HostAllreduce, trainer/gpu/nccl.py
    NcclAllreduce): its own gradient buffer, the sum in place, and what it can and did do."""

    via: str  # how the sums go: host, mpi (staged through host memory) or nccl (trainer/core/flops.py COMMS)
    overlaps: bool  # it can sum part of the buffer while the step computes the rest (start, sum_on)
    window_state: str | None  # NCCL's symmetric window: what was done; None where there is no window

    def empty(self, n: int) -> Any: ...

    def __call__(self, buf: Any) -> None: ...


def gradient_buffer(allreduce: AllReduce | None, xp: Any, n: int, dtype: Any) -> Any:
    """The flat buffer a step fills and ``allreduce`` sums: the all-reduce's own (NCCL keeps it in
    its window), else a plain array for one rank."""
    return allreduce.empty(n) if allreduce is not None else xp.empty(n, dtype=dtype)


def generic(xp: Any, layout: model.Layout, params: Any, allreduce: Any = None) -> GenericStep:
    """The generic step on ``params`` with its gradient buffer."""
    return GenericStep(layout, params, gradient_buffer(allreduce, xp, layout.size + 1, params.dtype), allreduce)


class GenericStep:
    def __init__(self, layout: model.Layout, params: Any, gbuf: Any, allreduce: Any = None) -> None:
        self.p, self.g, self.gbuf = layout.views(params), layout.views(gbuf[:-1]), gbuf
        self.allreduce = allreduce

    def prepare(self, x: Any, rows: list[tuple[int, int]]) -> None:
        """Nothing to prepare: the generic step multiplies X as it is (FusedStep.prepare)."""

    def forward(self, x: Any, y: Any) -> None:
        self.a1, z2 = model.forward(self.p, x)
        self.yhat, self.ce_sum = model.softmax_xent(z2, y)

    def backward(self, x: Any, y: Any, scale: float) -> None:
        model.backward(self.p, x, y, self.a1, self.yhat, scale, self.g)
        self.gbuf[-1] = self.ce_sum

    def zero_gradient(self) -> None:
        """Instead of forward and backward when this rank has no rows of the batch."""
        self.gbuf.fill(0)

    def reduce(self) -> None:
        """Sum the gradient (and the loss) over the ranks, if there are several."""
        if self.allreduce is not None:
            self.allreduce(self.gbuf)

    def update(self, lr: float, reg: float, inv_batch: float, loss_out: Any) -> None:
        """loss_out[0] <- this batch's global loss (before the update); then update in place."""
        loss_out[0] = self.gbuf[-1] * inv_batch + model.penalty(self.p, reg)
        model.sgd_update(self.p, self.g, lr, reg)

    def finish(self) -> None:
        """Nothing is left queued: the update is complete when ``update`` returns."""
