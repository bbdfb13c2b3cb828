"""The course's CPU check of a run: the sequential NumPy reference of its first k steps, started
beside the training (trainer/lifecycle/reference_jobs.py), and its weight error, logged into the run when it
lands, after the run ended if need be (the run ends with its training: a check still computing is
the tag sweepscale.check=pending, not a RUNNING run)."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig

from trainer import metrics
from trainer.config import check_steps
from trainer.core import model, reference
from trainer.core.loop import Schedule
from trainer.data import N_CLASSES
from trainer.lifecycle import reference_jobs
from trainer.ranks.sigterm import Terminated
from trainer.record import console, tracking


def start(
    cfg: DictConfig, layout: model.Layout, schedule: Schedule, init: np.ndarray, ds: Any, steps: int
) -> reference_jobs.Job:
    """The sequential NumPy run of this config's first ``steps`` steps, started beside the training
    (trainer/lifecycle/reference_jobs.py)."""
    dtype, seed, init_kind, scale = cfg.dtype.value, cfg.seed, cfg.model.init.value, cfg.data.scale.value

    def key(fingerprint: str) -> str:
        return reference.cache_key(layout, schedule, dtype, seed, fingerprint, init=init_kind, scale=scale, steps=steps)

    x, y = ds.x_train, ds.y_train
    return reference_jobs.submit(x, y, ds.fingerprint, key, layout, init, schedule, steps, cfg.check.cache_dir)


def first_weights(cfg: DictConfig, n_features: int) -> tuple[model.Layout, np.ndarray]:
    """The network's shape and initial weights for this config: the run's, and its reference's."""
    layout = model.Layout(D=n_features, H=cfg.hidden, C=N_CLASSES)
    return layout, _initial(layout, cfg.seed, cfg.dtype.value, cfg.model.init.value)


@functools.lru_cache(maxsize=8)
def _initial(layout: model.Layout, seed: int, dtype: str, init: str) -> np.ndarray:
    """Made once per worker: a GPU worker's prefetch made them for the references while it warmed up
    (H=2048's: 80 ms on the point's path, the references busy on the cores). The last 8 configs' are
    kept: a grid of more finds some made again, and holds at most 8 models' weights. Read-only."""
    flat = model.init_params(layout, seed, dtype, init)
    flat.flags.writeable = False  # the run trains a copy, the reference its own (shared memory)
    return flat


def steps_checked(cfg: DictConfig, n_samples: int, schedule: Schedule) -> int:
    """How many steps the CPU check compares: 0 without a check."""
    return reference.steps_of(check_steps(cfg.check.steps), n_samples, schedule) if cfg.check.reference else 0


def prefetch(cfg: DictConfig, ds: Any, schedule: Schedule) -> reference_jobs.Job | None:
    """Start the reference of a point still queued (a GPU worker's, trainer/worker.py): it lands in
    the cache, where the point's own check finds it, or waits for it (one lock per key), instead of
    computing it after the point trained. None: the point has no check."""
    if not (steps := steps_checked(cfg, len(ds.y_train), schedule)):
        return None
    layout, init = first_weights(cfg, ds.n_features)
    return start(cfg, layout, schedule, init, ds, steps)


def compare(recorder: tracking.Recorder, job: reference_jobs.Job, layout: model.Layout, weights: np.ndarray) -> float:
    """The weights' relative error against the sequential NumPy run's after the same steps, once
    ``job`` has it: logged into the run (ended or not) and returned. The job's error is raised here."""
    ref = job.result()
    errors = reference.relative_errors(layout, weights, ref.params)
    for name, err in errors.items():
        recorder.metric(metrics.weight_error(name), err)
    recorder.set_tags(
        {
            metrics.TAG_REFERENCE: "cached" if ref.cached else "computed",
            metrics.TAG_REFERENCE_KEY: ref.key,
            metrics.TAG_CHECK: "done",
        }
    )
    recorder.flush()
    return errors["max"]


@dataclass
class PendingCheck:
    """Rank 0's run, ended with its training, whose CPU check may still compute: :meth:`finish`
    waits for the reference and logs its error into the run. A warm worker trains the next point
    meanwhile. The run's status is its training's whatever happens to the check: a check that fails
    or is abandoned says so in the tag sweepscale.check."""

    job: reference_jobs.Job | None  # None: no reference to wait for
    beside: bool  # trained on a GPU: the next point may train while the CPU computes the reference
    recorder: tracking.Recorder
    layout: model.Layout
    weights: np.ndarray | None  # the run's weights after the steps the check compares
    steps: int

    def done(self) -> bool:
        return self.job is None or self.job.done()

    def finish(self) -> int:
        """Wait for the check and log it; 0, or 1 where the store refused even the check's failure.
        A SIGTERM while waiting abandons the check (sigterm.seen() then says so to a worker)."""
        if self.job is None:
            return 0
        try:
            error = compare(self.recorder, self.job, self.layout, self.weights)
            console.check_line(self.steps, error)
            outcome = ""
        except (KeyboardInterrupt, Terminated):
            outcome = "abandoned: the process ended before its reference check"
        except BaseException as e:  # a reference that raised, or whose process was killed
            outcome = f"failed: {type(e).__name__}: {e}"
            print(f"the CPU check of run {self.recorder.run_id} {outcome}", file=sys.stderr, flush=True)
        return self._close(outcome)

    def abandon(self) -> None:
        """The worker is ending before the reference did: the run stays as its training ended it."""
        if self.job is not None:
            self._close("abandoned: the worker ended before this run's reference check")

    def _close(self, outcome: str) -> int:
        try:
            if outcome:
                self.recorder.set_tags({metrics.TAG_CHECK: outcome[:5000]})
            self.recorder.close()
            return 0
        except Exception as e:  # the store may be what failed
            print(f"could not record the check of run {self.recorder.run_id}: {e}", file=sys.stderr, flush=True)
            return 1
