"""A run's timing figures by the protocol of trainer/core/timing.py, with a timing pass where
training timed too few batches: extra steps after training, on a scratch copy of the weights.

Every rank calls :func:`measure` (the pass's steps sum over the ranks); rank 0's figures are recorded.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from trainer.core.clock import PhaseClock
from trainer.core.timing import Measured, Protocol, measure, split_sum
from trainer.ranks import parallel

PASSES = 3  # timing passes at most: the first's length is estimated from the training's median batch


def measure_run(
    clock: PhaseClock,
    protocol: Protocol,
    batches_per_epoch: int,
    comm: object,
    time_epochs: Callable[[int], PhaseClock],
) -> Measured:
    """The run's figures from ``clock`` (its training's batches) past the warm-up; where those miss
    the floor, from ``time_epochs(E)``: E epochs run on a scratch copy of the weights (the first
    its warm-up), timed by the clock it returns."""
    skip = protocol.skipped(batches_per_epoch)
    sample, extra = clock.since(skip), 0
    estimate = float(np.median(clock.samples["batch"])) if clock.samples["batch"] else math.inf  # ms a batch
    for _ in range(PASSES):
        if parallel.agree(comm, int(not protocol.enough(sample.get("batch", []))), "max") == 0:
            break
        per_batch = estimate if math.isfinite(estimate) else 1.0
        epochs = math.ceil((skip + protocol.needed(per_batch)) / batches_per_epoch)  # its warm-up too
        timed = time_epochs(parallel.agree(comm, epochs, "max"))
        sample = timed.since(skip)
        extra = len(sample.get("batch", []))
        estimate = float(np.median(sample["batch"])) if sample.get("batch") else estimate  # a pass short of it: again
    measured = measure(sample, protocol.repeats, extra)
    if comm.Get_size() > 1 and "allreduce" in sample:
        every = comm.gather(np.asarray(sample["allreduce"]))
        if every is not None:  # rank 0
            measured.split = {k: float(np.median(v)) for k, v in split_sum(np.vstack(every)).items()}
    return measured
