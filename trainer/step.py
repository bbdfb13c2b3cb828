"""The step a run trains with: one SGD step split in the loop's phases (forward, backward into
the flat gradient buffer, the all-reduce, the update), in one of two implementations of the same
math, picked from the run's StepOptions (trainer/options.py):

- GenericStep (trainer/core/generic_step.py): model.py's functions, NumPy or CuPy.
- FusedStep (CuPy only, trainer/gpu/fused_step.py): cuBLAS GEMMs and fused kernels; with
  ``options.graph`` wrapped in a GraphedStep (trainer/gpu/graphs.py), its phases replayed as CUDA
  graphs, under the stream ``stream_for`` gives the run.

``build`` gives ``fit`` (trainer/core/loop.py) its step, ready: the loop never chooses.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from trainer.core import model
from trainer.core.generic_step import GenericStep, gradient_buffer
from trainer.options import StepOptions


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
    (hide an NCCL all-reduce behind its compute), ``options.graph`` (its phases as CUDA graphs)
    and ``options.x_levels`` (the caller's promise that every input is k / x_levels with k an
    integer, trainer/data.py's pixels; None promises nothing).
    ``allreduce`` sums the gradient buffer over the ranks (None: one rank)."""
    kind = options.kind
    if kind == "fused" or (kind == "auto" and xp is not np):
        if xp is np:
            raise ValueError("gpu.step=fused needs the GPU (CuPy); use gpu.step=generic or auto on the CPU")
        from trainer.gpu.fused_step import FusedStep

        fused = FusedStep(layout, params, gbuf, max_rows, options, allreduce)
        if options.graph:  # its phases replayed as CUDA graphs, once each batch has run once
            from trainer.gpu.graphs import GraphedStep

            return GraphedStep(fused)
        return fused
    return GenericStep(layout, params, gbuf, allreduce)


def stream_for(options: StepOptions) -> contextlib.AbstractContextManager:
    """Where a run's GPU work goes while it trains: a stream of its own where the step replays CUDA
    graphs (CUDA captures no work on the legacy default stream), else where it is."""
    if not options.graph:
        return contextlib.nullcontext()
    from trainer.gpu.graphs import compute_stream

    return compute_stream()


def build(
    options: StepOptions,
    xp: Any,
    layout: model.Layout,
    params: Any,
    batch_size: int,
    size: int = 1,
    allreduce: Any = None,
) -> Any:
    """The step ``fit`` takes for ``params``: its gradient buffer (the all-reduce's, where it keeps
    one), room for a rank's rows of a batch of ``batch_size`` split over ``size`` ranks."""
    gbuf = gradient_buffer(allreduce, xp, layout.size + 1, params.dtype)
    return make_step(options, xp, layout, params, gbuf, -(-batch_size // size), allreduce)
