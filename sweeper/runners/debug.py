"""In this process, one point at a time, nproc=1: breakpoints and pdb work in the trainer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from sweeper.job.point_job import PointFailedError
from sweeper.points import Point, Shape
from sweeper.runners.base import WithoutScheduler
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig


class FinishedInProcess:
    """Stands in for a submitit job that already ran (the Job protocol)."""

    job_id = "in-process"
    paths = None
    state = "DONE"

    def __init__(self, error: BaseException | None) -> None:
        self._error = error

    def done(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return self._error

    def cancel(self, check: bool = True) -> None:
        pass


class DebugRunner(WithoutScheduler):
    scheduler: ClassVar[str] = "debug"
    checkpoints: ClassVar[bool] = False
    ranks_start: ClassVar[str] = "one rank, in the sweeper's process"

    def __init__(self, launcher: DictConfig, folder: Path, job_name: str) -> None:
        pass  # nothing to set up: no executor, no folder (timeout_min does not apply in process)

    def shape(self, point: Point) -> Shape:
        if point.nproc != 1:
            raise ConfigError(f"point {point.name}: launcher=debug runs in this process, so nproc must be 1")
        return Shape(1, 1, 0)

    def check(self, points: list[Point]) -> None:
        pass

    def preview(self, groups: dict[Shape, list[Point]]) -> dict[str, str]:
        return {}

    def hands_off(self, points: list[Point]) -> bool:
        return False  # the trainer records its runs in this process

    def prestart(self, points: list[Point]) -> None:
        pass  # jobs start in start()

    def start(self, queued: list[Point]) -> list[tuple[Point, FinishedInProcess]]:
        from trainer.run import main as train

        point = queued.pop(0)
        status = train(point.trainer, [])
        error = None if status == 0 else PointFailedError(f"trainer returned status {status}")
        return [(point, FinishedInProcess(error))]

    def release(self, job: FinishedInProcess) -> None:
        pass

    def stop(self) -> None:
        pass

    def cancel(self, job: FinishedInProcess) -> None:
        pass  # the point ran to its end already
