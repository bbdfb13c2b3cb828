"""What a search is asked for (hydra.sweeper's keys under hydra/sweeper=search): its options
checked, where its study lives and under which name, and the pruner that judges its trials."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from trainer import metrics
from trainer.errors import ConfigError
from trainer.record.store import sqlite_file


@dataclass
class SearchOptions:
    """hydra.sweeper's keys (sweeper/config.py's SearchSweeperConfig is their schema)."""

    n_trials: int
    objective: str
    direction: str | None  # None: maximize a precision, minimize anything else (a loss, a time)
    study_name: str | None
    storage: str | None
    seed: int | None
    pruner: str = "none"
    prune_threshold: float | None = None
    target: float | None = None  # report.target: the test precision of objective=time_to_target

    def __post_init__(self) -> None:
        if self.direction in (None, "None"):
            self.direction = "maximize" if self.objective == metrics.TEST_PRECISION else "minimize"


# An objective no run records: the training seconds to report.target, from the trial's epochs
# (sweeper/report/analysis.py seconds_to_target); a trial that never reaches it is told infinity.


def progress_keys() -> tuple[str, ...]:
    """The metrics a trial reports each epoch (trainer/lifecycle/epoch_end.py): what a pruner can judge."""
    return (metrics.TEST_PRECISION, metrics.TRAIN_LOSS_EPOCH)


def check(opts: SearchOptions) -> None:
    """ConfigError naming the key and the fix, before anything starts."""
    if opts.n_trials < 1:
        raise ConfigError(f"hydra.sweeper.n_trials={opts.n_trials}: a search needs at least 1 trial")
    if opts.objective not in (*metrics.OBJECTIVES, metrics.TIME_TO_TARGET):
        raise ConfigError(
            f"hydra.sweeper.objective={opts.objective}: no run records it; use one of "
            f"{', '.join((*metrics.OBJECTIVES, metrics.TIME_TO_TARGET))}"
        )
    if opts.pruner != "none" and opts.objective not in progress_keys():
        raise ConfigError(
            f"hydra.sweeper.pruner={opts.pruner} judges a trial by its objective each epoch, and "
            f"{opts.objective} is not recorded each epoch: use one of {', '.join(progress_keys())}"
        )
    if opts.objective == metrics.TIME_TO_TARGET and opts.target is None:
        raise ConfigError(
            "hydra.sweeper.objective=time_to_target needs the test precision to reach: set report.target, e.g. 0.9"
        )
    if opts.pruner == "threshold" and opts.prune_threshold is None:
        raise ConfigError("hydra.sweeper.pruner=threshold needs hydra.sweeper.prune_threshold, e.g. 0.5")


def pruner(opts: SearchOptions, width: int) -> Any:
    """Optuna's pruner for ``opts.pruner``; the median waits for more trials than run at once."""
    import optuna

    if opts.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=width + 1)
    if opts.pruner == "threshold":
        side = "lower" if opts.direction == "maximize" else "upper"
        return optuna.pruners.ThresholdPruner(**{side: opts.prune_threshold})
    return optuna.pruners.NopPruner()


def storage_for(storage: str | None, tracking_uri: str) -> str:
    """The study's storage: the key's, else ``optuna.db`` beside a SQLite MLflow store."""
    if storage:
        return storage
    db = sqlite_file(tracking_uri)
    if db is None:
        raise ConfigError(
            f"hydra.sweeper.storage: the MLflow store {tracking_uri} is not a SQLite file, so the study has no "
            "default home; name one, e.g. hydra.sweeper.storage=postgresql://user@host/optuna or sqlite:///optuna.db"
        )
    return f"sqlite:///{db.parent / 'optuna.db'}"


# Keys that change how a sweep runs and reports, not what a trial computes: the same study resumes
# whatever they are (report.figures=false, launcher=slurm, sweep.poll_s, ...).
NOT_A_TRIALS = ("report", "sweep", "launcher", "hydra")


def study_name(space: dict[str, Any], fixed: list[str], opts: SearchOptions) -> str:
    """A name the same command gives again (so that it resumes): what is searched, what is fixed of
    the trials (not NOT_A_TRIALS), and towards what."""
    from optuna.distributions import distribution_to_json

    trials = [o for o in fixed if o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] not in NOT_A_TRIALS]
    doc = {
        "space": {k: distribution_to_json(d) for k, d in sorted(space.items())},
        "fixed": sorted(trials),
        "objective": [opts.objective, opts.direction],
    }
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:10]
    return f"{'-'.join(sorted(space))}-{digest}"
