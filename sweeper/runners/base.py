"""What every runner does, and how the sweep gets the one its launcher config names.

A runner owns everything that differs between launchers: the shape of a point, the checks made
before anything is submitted, the preview of what would be submitted, and starting, releasing
and cancelling jobs. Adding a launcher is one module here plus one config dataclass with its
``_target_`` (sweeper/config.py) and one YAML file (conf/launcher/).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from sweeper.folders import JOB_FILES
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from sweeper.points import Point, Shape


class MachineTooSmallError(ConfigError):
    """A point asks for more than this machine has (cores, GPUs): a sweep is refused, a preview
    (--dry-run) shows the point and says so; a preview is for the machine the sweep will run on."""


class SchedulerAwayError(ConfigError):
    """The scheduler's commands are not here or do not answer: a sweep cannot start, but its preview
    (--dry-run) goes on from the config alone, saying what it could not check."""


@runtime_checkable
class Job(Protocol):
    """The part of a submitit job the sweep uses (the debug runner gives a stand-in)."""

    job_id: str
    paths: Any  # has .stdout and .stderr, or None when the job wrote no log files

    def done(self) -> bool: ...

    def exception(self) -> BaseException | None: ...

    def cancel(self, check: bool = True) -> None: ...


@runtime_checkable
class Runner(Protocol):
    """Built as ``Runner(launcher, folder, job_name)`` from the launcher config's ``_target_``."""

    scheduler: ClassVar[str]  # recorded on the parent run (tag sweepscale.scheduler)
    checkpoints: ClassVar[bool]  # a job may stop and run again (a requeue): its trainer checkpoints every epoch
    job_a_point: bool  # each pending job is a point waiting (cold), not a warm worker's allocation

    @property
    def ranks_start(self) -> str:
        """How a point's ranks start, in a line (tag sweepscale.ranks_start of the parent run)."""
        ...

    def shape(self, point: Point) -> Shape:
        """The point's resources; raises ConfigError when this launcher cannot give them."""
        ...

    def check(self, points: list[Point]) -> None:
        """Pre-flight checks beyond one point (e.g. the Slurm partition); raises ConfigError, or
        SchedulerAwayError where the scheduler cannot be asked (after the checks that need it not)."""
        ...

    def preview(self, groups: dict[Shape, list[Point]]) -> dict[str, str]:
        """What would be submitted, by title (empty when there is nothing to add)."""
        ...

    def hands_off(self, points: list[Point]) -> bool:
        """Whether these points' runs are created by the sweeper, from the journals its jobs write
        (local warm workers on a SQLite store, sweeper/track/handoff.py), not by the jobs: they may start
        before the sweep's parent run exists (sweeper/track/ahead.py)."""
        ...

    def prestart(self, points: list[Point]) -> None:
        """Start what may start before the runs are recorded (warm workers, which then wait for
        ``start``'s tickets); ``stop`` ends it if the sweep ends first."""
        ...

    def start(self, queued: list[Point]) -> list[tuple[Point, Job]]:
        """Start what can start now, removing it from ``queued``; the rest waits for a release."""
        ...

    def pending(self) -> dict[str, int]:
        """Jobs the scheduler holds before they start, counted by its reason (Slurm's
        ``Resources``, ``Priority``, ...); empty where nothing waits in a queue."""
        ...

    def live(self, job_ids: list[str]) -> set[str]:
        """Which of these scheduler jobs (an earlier sweep's) still run or wait: their runs go on
        without a sweeper. Empty where jobs end with their sweeper."""
        ...

    def accounting(self, job_ids: list[str]) -> dict[str, str]:
        """The scheduler's last word on these jobs, e.g. Slurm's "TIMEOUT 1:00:02" (sacct's state and
        elapsed time); empty where there is no scheduler."""
        ...

    def allocated(self) -> str:
        """What the scheduler allocated to the sweep's jobs, every run of each (requeues included), in
        a line; empty where no scheduler keeps accounts."""
        ...

    def cancel_pending(self, job_name: str) -> list[str]:
        """Cancel the jobs a dead sweeper of this name left waiting in the scheduler's queue (they
        would train points the sweep that closed it runs); their ids, empty where nothing waits."""
        ...

    def release(self, job: Job) -> None:
        """The job is done: give its resources back."""
        ...

    def cancel(self, job: Job) -> None:
        """Ask the job to end (SIGTERM to the trainer, which ends its run KILLED)."""
        ...

    def stop(self) -> None:
        """The sweep was interrupted, or failed before its watch ended: end what the runner holds beyond
        the jobs (idle workers, and workers still waiting for their tickets)."""
        ...


@runtime_checkable
class Streaming(Protocol):
    """A runner that can take points while the sweep runs (a search's trials, sweeper/search/flow.py):
    warm workers, the local runner's processes or the Slurm runner's allocations."""

    def stream(self) -> bool:
        """From now on points come while the sweep runs, their queues left open until
        ``end_stream``; False where this runner cannot (cold jobs)."""
        ...

    def units(self, shape: Shape) -> int:
        """The GPUs, or cores, points of this shape share: how many a search keeps in flight."""
        ...

    def end_stream(self) -> None:
        """The last point has come: the queues sealed, their workers end once idle."""
        ...


class WithoutScheduler:
    """What a runner whose jobs are this machine's processes says of a scheduler's queue and
    accounts: nothing waits, nothing outlives its sweeper, nobody keeps accounts."""

    job_a_point = False  # nothing waits in a scheduler's queue here

    def pending(self) -> dict[str, int]:
        return {}

    def live(self, job_ids: list[str]) -> set[str]:
        return set()  # a local job ends with the sweeper that started it

    def accounting(self, job_ids: list[str]) -> dict[str, str]:
        return {}

    def allocated(self) -> str:
        return ""

    def cancel_pending(self, job_name: str) -> list[str]:
        return []


def make_runner(launcher: DictConfig, sweep_dir: Path, job_name: str) -> Runner:
    """The runner class named by ``launcher._target_`` (as Hydra's submitit plugin dispatches)."""
    from hydra.utils import get_class

    folder = Path(launcher.folder or sweep_dir / JOB_FILES).resolve()
    runner = get_class(launcher._target_)(launcher, folder, job_name)
    if not isinstance(runner, Runner):
        raise TypeError(f"launcher._target_={launcher._target_} is not a sweeper.runners.base.Runner")
    return runner
