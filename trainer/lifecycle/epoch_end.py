"""What a rank does at the end of each epoch: rank 0 checkpoints, records the epoch, prints its
line and stops a run whose loss diverged; every rank stops together at Slurm's time-limit
warning (a checkpoint is there to resume from)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainer import metrics
from trainer.config import Divergence
from trainer.core import model
from trainer.core.clock import PhaseClock
from trainer.core.loop import EpochResult, Snapshot, check_finite
from trainer.lifecycle import progress, requeue
from trainer.lifecycle.progress import StopRequested
from trainer.lifecycle.requeue import TimeLimitReached
from trainer.ranks import parallel, sigterm
from trainer.record import checkpoint, console, tracking
from trainer.record.run_record import record_epoch


@dataclass
class EpochEnd:
    """``fit``'s ``on_epoch``. ``last`` keeps the last epoch's loss and precision for the summary."""

    cfg: Any
    comm: Any  # the world's communicator: the time-limit warning is agreed on by every rank
    recorder: tracking.Recorder | None  # rank 0's; None on the other ranks
    to_host: Callable[[Any], np.ndarray]
    layout: model.Layout
    params: Any
    test: tuple[Any, Any]  # (x_test, y_test) where the weights are
    clock: PhaseClock
    origin: float  # the start of the time to first batch
    snapshot: Snapshot | None
    resume_key: str = ""  # the checkpoints' key (hashing the config is not per epoch work)
    last: dict[str, float | None] = field(default_factory=dict)
    training_s: float = 0.0  # the epochs' time so far (a resumed run's: from its checkpoint on)
    held_from: float = 0.0  # time.perf_counter() when the devices became the run's (moved back on a resume)

    def __call__(self, e: EpochResult) -> None:
        self.training_s += e.seconds
        if self.recorder is not None:
            precision = self.precision()
            if self.resume_key and e.epoch < self.cfg.epochs:  # before the metrics: a kill between them loses none
                self.save(e, precision)
            if e.epoch == 1 and self.clock.first_start is not None:
                self.recorder.metric(metrics.TIME_TO_FIRST_BATCH, self.clock.first_start - self.origin)
            record_epoch(self.recorder, e, precision)
            console.epoch_line(e.epoch, self.cfg.epochs, e.mean_loss, precision, e.seconds)
            self.last.update(loss=e.mean_loss, precision=precision)
            if self.cfg.save.progress_dir:  # a search reads it between epochs (its pruner)
                values = {metrics.TRAIN_LOSS_EPOCH: e.mean_loss, metrics.TEST_PRECISION: precision}
                progress.append(self.cfg.save.progress_dir, e.epoch, {**values, metrics.EPOCH_TIME: e.seconds})
            if self.cfg.check.divergence == Divergence.stop:
                check_finite(e)
        if e.epoch < self.cfg.epochs and requeue.warned(self.comm):  # every rank, together
            raise TimeLimitReached(e.epoch, self.cfg.epochs)
        if e.epoch < self.cfg.epochs and self.cfg.save.progress_dir:
            asked = progress.stop_asked(self.cfg.save.progress_dir) if self.recorder is not None else None
            why = parallel.share(self.comm, asked)  # rank 0's view, every rank (asleep: see requeue.warned)
            if why is not None:
                raise StopRequested(e.epoch, self.cfg.epochs, why)
        sigterm.check()  # a SIGTERM whose exception a library swallowed: the epoch is recorded, then KILLED

    def precision(self) -> float | None:
        x_test, y_test = self.test
        if not len(y_test):
            return None
        return float(model.correct(self.layout.views(self.params), x_test, y_test)) / len(y_test)

    def save(self, e: EpochResult, precision: float | None) -> None:
        done = e.first_iteration + len(e.losses)
        acc = np.nan if precision is None else precision
        state = (self.to_host(self.params), e.epoch, done, self.recorder.run_id, self.resume_key)
        held = {"held_s": time.perf_counter() - self.held_from, "training_s": self.training_s}
        saved = checkpoint.Checkpoint(*state, e.losses, e.batch_sizes, e.seconds, acc, self.snapshot_on_host(), **held)
        checkpoint.save(self.cfg.save.checkpoint_dir, saved)

    def snapshot_on_host(self) -> np.ndarray:
        """The check's weights on the host: copied from the device once (they no longer change)."""
        if self.snapshot is None or self.snapshot.weights is None:
            return np.zeros(0)
        if not isinstance(self.snapshot.weights, np.ndarray):
            self.snapshot.weights = self.to_host(self.snapshot.weights)
        return self.snapshot.weights
