"""Mini-batch SGD, data parallel: split the batch, forward, backward, all-reduce, update.

The same loop trains on the GPU ranks and, with a world of one and NumPy, is the sequential
CPU reference: only the array module and the all-reduce differ.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.core.clock import PhaseClock

# Phases timed in every batch, in order; "batch" is their sum.
STEP_PHASES = ("h2d", "forward", "backward", "allreduce", "update")
# An epoch's end waits for the GPU awake: spinning first (an epoch's queued work is milliseconds),
# then asleep between queries.
DEVICE_SPIN_S = 0.1
DEVICE_POLL_S = 0.002


@dataclass(frozen=True)
class Schedule:
    """What decides the sequence of updates (and so the reference result)."""

    batch_size: int
    lr: float
    reg: float
    epochs: int
    shuffle: bool = False
    seed: int = 0


@dataclass
class EpochResult:
    epoch: int  # 1-based
    first_iteration: int  # global iteration number of losses[0]
    losses: np.ndarray  # global mini-batch loss of each iteration
    batch_sizes: np.ndarray
    seconds: float

    @property
    def mean_loss(self) -> float:
        """Loss over the epoch: the batches' losses weighted by their sizes."""
        return float(np.average(self.losses, weights=self.batch_sizes))


@dataclass
class Snapshot:
    """The weights after ``step`` steps, copied where they live (on a GPU, a device copy queued on the
    stream: no host synchronisation) by :func:`fit` into ``weights``; with ``stop``, fit returns there."""

    step: int
    stop: bool = False
    weights: Any = None


class DivergedError(RuntimeError):
    """A training loss that is NaN or infinite (check.divergence=stop)."""


def check_finite(e: EpochResult) -> None:
    """Raise at the first non-finite loss of the epoch, naming its step (its curve is recorded)."""
    bad = np.flatnonzero(~np.isfinite(e.losses))
    if bad.size:
        k = e.first_iteration + int(bad[0])
        raise DivergedError(
            f"diverged at step {k} (epoch {e.epoch}): training loss {e.losses[bad[0]]}; "
            "lower lr, or set check.divergence=go_on to train on"
        )


def local_rows(n: int, size: int, rank: int) -> tuple[int, int]:
    """This rank's [lo, hi) of n rows split as evenly as possible (sizes differ by at most 1)."""
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


def epoch_order(n: int, epoch: int, schedule: Schedule) -> np.ndarray | None:
    """Sample order of an epoch: None (in order) unless shuffling, then seeded per epoch."""
    if not schedule.shuffle:
        return None
    return np.random.default_rng([schedule.seed, epoch]).permutation(n)


def sgd_step(
    step: Any,
    xb: Any,
    yb: Any,
    global_rows: int,
    schedule: Schedule,
    loss_out: Any,
    clock: PhaseClock | None = None,
) -> None:
    """forward -> backward -> all-reduce -> update for this rank's rows of one global batch
    (``step``: trainer/step.py build, which owns the gradient buffer and the all-reduce)."""
    if len(yb):
        step.forward(xb, yb)
    if clock:
        clock.mark()
    if len(yb):
        step.backward(xb, yb, 1.0 / global_rows)
    else:  # a short last batch can leave a rank without samples
        step.zero_gradient()
    if clock:
        clock.mark()
    step.reduce()
    if clock:
        clock.mark()
    step.update(schedule.lr, schedule.reg, 1.0 / global_rows, loss_out)
    if clock:
        clock.mark()


def batch_bounds(n: int, batch_size: int, size: int, rank: int) -> list[tuple[int, int, int, int]]:
    """Per batch of an epoch: its global [start, stop) and this rank's [lo, hi) of it."""
    out = []
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        out.append((start, stop, *local_rows(stop - start, size, rank)))
    return out


def rows_of(xp: Any, x: Any, y: Any, order: Any, lo: int, hi: int) -> tuple[Any, Any]:
    """Rows lo..hi of the epoch's order (None: in order) where the step reads them: a host slice is
    copied to the device (the "h2d" phase), a device gather stays there."""
    if order is None:
        return xp.asarray(x[lo:hi]), xp.asarray(y[lo:hi])
    rows = order[lo:hi]
    return xp.asarray(x[rows]), xp.asarray(y[rows])


def fit(
    step: Any,
    xp: Any,
    params: Any,
    x: Any,
    y: Any,
    schedule: Schedule,
    rank: int = 0,
    size: int = 1,
    clock: PhaseClock | None = None,
    on_epoch: Callable[[EpochResult], None] | None = None,
    before_step: Callable[[int], None] | None = None,
    start_epoch: int = 1,
    snapshot: Snapshot | None = None,
    on_step: Callable[[int], None] | None = None,
) -> Any:
    """Train ``params`` (a flat xp array, updated in place) and return it.

    ``x``/``y`` hold the whole training set, on the device or on the host; a host array is
    copied to the device one slice per batch (the "h2d" phase). Every rank runs this with the
    same params and schedule; ``step`` (trainer/step.py build: generic or fused, with its gradient
    buffer and all-reduce) updates ``params`` in place, one batch at a time. ``start_epoch`` > 1 resumes
    from ``params`` as a checkpoint left them after epoch ``start_epoch - 1`` (trainer/record/checkpoint.py).
    ``snapshot`` takes a copy of the weights after its step (the CPU reference check compares those);
    ``on_step`` is told the steps done after each one.
    """
    n = len(y)
    bounds = batch_bounds(n, schedule.batch_size, size, rank)
    n_batches = len(bounds)
    # Batches in order from device-resident data: the fused step prepares X for its GEMMs once.
    prepared = None
    if not schedule.shuffle and not isinstance(x, np.ndarray):
        prepared = step.prepare(x, [(start + lo, start + hi) for start, _, lo, hi in bounds])
    iteration = (start_epoch - 1) * n_batches
    losses = xp.zeros(n_batches, dtype=params.dtype)  # one buffer for every epoch: a captured update writes there
    for epoch in range(start_epoch, schedule.epochs + 1):
        order = epoch_order(n, epoch, schedule)
        if order is not None and not isinstance(x, np.ndarray):
            order = xp.asarray(order)  # gather on the device where the data lives
        losses.fill(0)
        sizes = np.empty(n_batches, dtype=np.int64)
        t0 = time.perf_counter()
        for b, (start, stop, lo, hi) in enumerate(bounds):
            if clock:
                clock.start()
            if prepared is not None:
                xb, yb = prepared[b], y[start + lo : start + hi]
            else:
                xb, yb = rows_of(xp, x, y, order, start + lo, start + hi)
            if clock:
                clock.mark()
            if before_step is not None:  # told the iteration about to run (config fault.*: trainer/lifecycle/faults.py)
                before_step(iteration)
            sgd_step(step, xb, yb, stop - start, schedule, losses[b : b + 1], clock)
            sizes[b] = stop - start
            iteration += 1
            if snapshot is not None and iteration == snapshot.step:
                step.finish()  # an update the step left queued, first
                snapshot.weights = params.copy()
                if snapshot.stop:
                    return params
            if on_step is not None:
                on_step(iteration)
        step.finish()  # the weights and the losses are complete past this point
        wait_for_device(xp)
        host_losses = losses.get() if xp is not np else losses.copy()
        seconds = time.perf_counter() - t0
        if clock:
            clock.flush()
        if on_epoch:
            on_epoch(EpochResult(epoch, iteration - n_batches, host_losses, sizes, seconds))
    return params


def wait_for_device(xp: Any) -> None:
    """Wait until the work queued on the current stream is done, polling: a rank inside CUDA's
    blocking wait runs no Python signal handler, and a peer that a stop ended first leaves NCCL's
    sum, and so that wait, unfinished for good (the run must still end KILLED: trainer/ranks/sigterm.py)."""
    if xp is np:
        return
    done = xp.cuda.Event(disable_timing=True)
    done.record()
    spin_until = time.perf_counter() + DEVICE_SPIN_S
    while not done.done:
        if time.perf_counter() > spin_until:
            time.sleep(DEVICE_POLL_S)
