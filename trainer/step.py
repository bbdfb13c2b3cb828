"""One SGD step split in the loop's phases: forward, backward (into the flat gradient buffer),
then, after the all-reduce, the update. Two implementations of the same math:

- GenericStep (here): model.py's functions, NumPy or CuPy, one array op per kernel. The readable
  reference, and what the CPU ranks and the sequential check run.
- FusedStep (CuPy only, trainer/gpu/fused_step.py): cuBLAS GEMMs and fused kernels.

``make_step(options, ...)`` picks one from the run's StepOptions (trainer/options.py). Every step
has the same five calls, which trainer/loop.py makes in order: forward, backward (or zero_gradient
for a rank without rows), reduce, update, and finish at the end of an epoch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainer import model
from trainer.options import StepOptions


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


def make_step(
    options: StepOptions,
    xp: Any,
    layout: model.Layout,
    params: Any,
    gbuf: Any,
    max_rows: int,
    allreduce: Any = None,
) -> Any:
    """``options.kind``: generic, fused, or auto (fused with CuPy, generic with NumPy); the fused
    step takes ``options.gemm`` (how its float32 GEMMs run; float64 ignores it), ``options.overlap``
    (hide an NCCL all-reduce behind its compute) and ``options.x_levels`` (the caller's promise that
    every input is k / x_levels with k an integer, trainer/data.py's pixels; None promises nothing).
    ``allreduce`` sums the gradient buffer over the ranks (None: one rank)."""
    kind = options.kind
    if kind == "fused" or (kind == "auto" and xp is not np):
        if xp is np:
            raise ValueError("gpu.step=fused needs the GPU (CuPy); use gpu.step=generic or auto on the CPU")
        from trainer.gpu.fused_step import FusedStep

        return FusedStep(layout, params, gbuf, max_rows, options, allreduce)
    return GenericStep(layout, params, gbuf, allreduce)
