"""Typed schema of a sweep: every trainer key at the top level, plus `launcher` and `sweep`.

Values live in conf/sweep.yaml and conf/launcher/*.yaml; Hydra rejects unknown keys and
ill-typed values against these dataclasses. Each launcher config names its runner class in
``_target_`` (as Hydra's submitit plugin does): that class, not a name, decides how points run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from trainer import limits
from trainer.config import TrainerConfig
from trainer.config import register as register_trainer
from trainer.errors import ConfigError


@dataclass
class LauncherConfig:
    """What every launcher has."""

    timeout_min: int = 60  # a point's time limit (a warm job's: this times its points; Slurm's --time)
    folder: str | None = None  # submitit's folder for job files and logs (null: inside the sweep dir)
    # Warm workers: ranks start once and serve many points (trainer/worker.py); false: a process per point.
    warm: bool = True
    max_restarts: int = 2  # fresh workers for the points left after a worker died, per queue


@dataclass
class LocalLauncherConfig(LauncherConfig):
    """Points run on this machine; each point's ranks start with mpiexec."""

    _target_: str = "sweeper.runners.local.LocalRunner"
    # GPUs the sweep may use (null: all visible). Points never share a GPU.
    gpus: int | None = None
    # CPU cores the sweep may use when points run on the CPU (null: all).
    cpus: int | None = None
    # A CPU point asking more ranks than those cores runs with its ranks sharing them (a laptop's
    # headline), its timings flagged; false: refused.
    oversubscribe: bool = True
    # A warm worker whose job has written no log this long after its start never started its task:
    # killed and restarted (a local job's controller was seen, rarely, to start nothing).
    start_grace_s: float = 30.0


class Pmi(str, Enum):
    """How a Slurm point's ranks start (sweeper/runners/bootstrap.py)."""

    auto = "auto"  # the pair that fits the MPI mpi4py loads and the plugins srun offers
    pmi2 = "pmi2"  # each Slurm task a rank: srun --mpi=pmi2 (MPICH, the mpich extra)
    pmix = "pmix"  # srun --mpi=pmix (Open MPI, with Slurm's pmix plugin)
    mpiexec = "mpiexec"  # the MPI's own mpiexec inside the allocation (no srun PMI needed)


@dataclass
class SlurmLauncherConfig(LauncherConfig):
    """submitit's Slurm executor: one job array per resource shape, one task per MPI rank."""

    _target_: str = "sweeper.runners.slurm.SlurmRunner"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    mem: str | None = None  # per node, e.g. "32G"
    constraint: str | None = None
    gpus_per_node: int | None = None  # 0: ranks run on CPUs; null: the partition's (its nodes' gres gpu:N)
    ranks_per_node: int | None = None  # null: one per GPU, or per cpus_per_task of a node's CPUs
    max_nodes: int | None = None  # null: the partition's nodes
    cpus_per_task: int = 1
    pmi: Pmi = Pmi.auto  # how ranks start: srun --mpi=pmi2 or pmix, or mpiexec in the allocation
    array_parallelism: int = 16
    points_per_job: int = 8  # warm: points one allocation serves (a job array of such chunks)
    max_requeues: int = 3  # a job warned of its time limit checkpoints and requeues itself this often
    sbatch_args: dict[str, str] = field(default_factory=dict)
    srun_args: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)


@dataclass
class DebugLauncherConfig(LauncherConfig):
    """In this process, one point at a time, nproc=1: breakpoints and pdb work."""

    _target_: str = "sweeper.runners.debug.DebugRunner"


@dataclass
class SweepOptions:
    dry_run: bool = False  # preview the points and their resources; submit nothing
    force: bool = False  # rerun points that already have a FINISHED run
    poll_s: float = 0.1  # the watch's look at the jobs; each is a few file checks (squeue rate-limited apart)
    # At the sweep's end, the longest wait on one call to a tracking server (http): what a server that
    # does not answer cannot take waits in journals for `python -m sweeper.sync`.
    store_wait_s: float = 10.0
    # At the sweep's end, time again alone the points a scaling family's speedups would otherwise take
    # from timings that had company (sweeper/track/retime.py).
    retime: bool = True


@dataclass
class ReportOptions:
    # The time-to-accuracy figure's test precision; null: the highest (in hundredths) that 3 of 4
    # finished points reach.
    target: float | None = None
    # false: the report's tables, findings and summary without figures, and no drawing processes
    # (a quick look, or hundreds of points); `python -m sweeper.report` draws them later.
    figures: bool = True


@dataclass
class SweepConfig(TrainerConfig):
    launcher: Any = MISSING
    sweep: SweepOptions = field(default_factory=SweepOptions)
    report: ReportOptions = field(default_factory=ReportOptions)


class Direction(Enum):
    minimize = "minimize"
    maximize = "maximize"


class Pruner(Enum):
    none = "none"
    median = "median"  # Optuna's MedianPruner: below the median of earlier trials at the same epoch
    threshold = "threshold"  # Optuna's ThresholdPruner: past hydra.sweeper.prune_threshold


@dataclass
class SearchSweeperConfig:
    """hydra/sweeper=search: an asynchronous Optuna search (sweeper/search/study.py); its keys under hydra.sweeper."""

    _target_: str = "hydra_plugins.sweepscale_launcher.search.SearchSweeper"
    n_trials: int = 20  # the study's trials in all: a study resumed runs what is left
    objective: str = "test/precision"  # a metric every trial's run records (its last value), or time_to_target
    direction: Direction | None = None  # null: maximize test/precision, minimize anything else
    study_name: str | None = None  # null: named by the space, the fixed overrides and the objective
    storage: str | None = None  # null: sqlite optuna.db beside a SQLite MLflow store
    seed: int | None = 0  # the TPE sampler's seed
    pruner: Pruner = Pruner.none  # stop trials between epochs (their runs end KILLED, the sweep calls them PRUNED)
    prune_threshold: float | None = None  # pruner=threshold: below it (maximize) or above it (minimize) stops


# Command-line shorthands for sweep options: python -m sweeper -m ... --dry-run
FLAGS = {"--dry-run": "sweep.dry_run=true", "--force": "sweep.force=true"}

# Launcher keys that were renamed: old spelling -> the one key now.
RENAMED = {"launcher.time_min": "launcher.timeout_min"}

# The config group's option names (conf/launcher/<name>.yaml) -> their schemas.
SCHEMAS = {"local": LocalLauncherConfig, "slurm": SlurmLauncherConfig, "debug": DebugLauncherConfig}


def reject_renamed(args: list[str]) -> None:
    """Stop on an override that uses a renamed key, naming the key it is now."""
    for arg in args:
        key = arg.lstrip("+~").split("=", 1)[0]
        if key in RENAMED:
            raise ConfigError(f"{key} is now {RENAMED[key]} (one spelling for every launcher)")


MIN_TIME_MIN = 2  # a Slurm point's least limit: a worker's start took up to 75 s on a busy node (#50)


def validate_sweep(base: Any) -> None:
    """Range checks of the launcher and sweep keys (Hydra checks their types): ConfigError naming
    the key and the fix, before any job starts or anything is recorded."""
    launcher, sweep = base.launcher, base.sweep
    checks = [
        (
            launcher.timeout_min >= 1,
            f"launcher.timeout_min={launcher.timeout_min}: a point needs at least 1 minute; e.g. 60",
        ),
        (launcher.max_restarts >= 0, f"launcher.max_restarts={launcher.max_restarts}: 0 or more"),
        (
            sweep.store_wait_s >= 1,
            f"sweep.store_wait_s={sweep.store_wait_s}: at least 1 second per call to the tracking server, e.g. 10",
        ),
        (
            sweep.poll_s > 0,
            f"sweep.poll_s={sweep.poll_s}: the watch polls every poll_s seconds; set a positive value, e.g. 0.5",
        ),
    ]
    if base.report.target is not None:
        target = base.report.target
        checks.append((0 < target <= 1, f"report.target={target}: a test precision in (0, 1], e.g. 0.9"))
    for key in ("points_per_job", "array_parallelism", "ranks_per_node", "max_nodes", "cpus_per_task"):
        if launcher.get(key) is not None:
            checks.append((launcher[key] >= 1, f"launcher.{key}={launcher[key]}: at least 1"))
    if "start_grace_s" in launcher:
        checks.append(
            (launcher.start_grace_s > 0, f"launcher.start_grace_s={launcher.start_grace_s}: above 0, e.g. 30")
        )
    if "max_requeues" in launcher:  # Slurm's
        checks.append((launcher.max_requeues >= 0, f"launcher.max_requeues={launcher.max_requeues}: 0 or more"))
        checks.append(
            (
                launcher.timeout_min >= MIN_TIME_MIN,
                f"launcher.timeout_min={launcher.timeout_min}: on Slurm a point needs at least {MIN_TIME_MIN} "
                "minutes (its worker's start took up to 75 s on a busy node, and the requeue signal comes a "
                "quarter of the limit before it); e.g. 60",
            )
        )
    for key in ("gpus", "cpus", "gpus_per_node"):
        if launcher.get(key) is not None:
            checks.append((launcher[key] >= 0, f"launcher.{key}={launcher[key]}: cannot be negative"))
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    if launcher.folder is not None:  # the jobs' files and logs: found unwritable now, not at submission
        limits.check_writable("launcher.folder", launcher.folder)


def register() -> None:
    register_trainer()
    cs = ConfigStore.instance()
    cs.store(name="sweep_schema", node=SweepConfig)
    for name, node in SCHEMAS.items():
        cs.store(group="launcher", name=f"{name}_schema", node=node)
    # Hydra's basic sweeper, checking the grid with the launcher's fast composition (BasicSweeperConf's keys).
    sweeper = {"_target_": "hydra_plugins.sweepscale_launcher.sweeper.SweepscaleSweeper", "max_batch_size": None}
    cs.store(group="hydra/sweeper", name="sweepscale", node={**sweeper, "params": None})
    cs.store(group="hydra/sweeper", name="search", node=SearchSweeperConfig)
    cs.store(
        group="hydra/launcher",
        name="sweepscale",
        node={"_target_": "hydra_plugins.sweepscale_launcher.launcher.SweepscaleLauncher"},
    )
