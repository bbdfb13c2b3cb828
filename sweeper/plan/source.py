"""Where a sweep's points come from. The sweep (sweeper/sweep.py) asks its source for the points
its checks stand for, its first points to run, more as its watch goes, and every point at the end;
it never asks which kind of source it has. A grid (this module) knows all its points at the start;
a search (sweeper/search/flow.py) asks its study for a trial each time a worker frees.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sweeper.plan.shapes import distinct, plan

if TYPE_CHECKING:
    from sweeper.points import Point, Shape
    from sweeper.runners.base import Runner


@runtime_checkable
class PointSource(Protocol):
    """What the sweep asks of its points' source, in the order it asks."""

    # Every point is known before the sweep starts: they may start before the store is open, the
    # report is drawn while they run, and those timed with company are timed again alone at the end.
    known_ahead: bool

    def plan(self, runner: Runner, preview: bool = False) -> tuple[list[Point], dict[Shape, list[Point]]]:
        """The points every check stands for, grouped by shape (ConfigError where one cannot run;
        a ``preview`` shows a point this machine is too small for)."""
        ...

    def open(self, runner: Runner, planned: list[Point]) -> None:
        """Ready to run, after the checks and before any worker (ConfigError where nothing would run)."""
        ...

    def first(self, runner: Runner) -> list[Point]:
        """The points to run first."""
        ...

    @property
    def total(self) -> int:
        """How many points the sweep runs in all (its progress line's 'of N')."""
        ...

    def feed(self, record: Any, runner: Runner, sweep_id: str, done_before: dict[str, str]) -> More | None:
        """The watch's source of more points as it goes (None: the first points are all)."""
        ...

    def end(self, record: Any, runner: Runner, flight: Any, done_before: dict[str, str]) -> list[Point]:
        """The watch has ended: every point this sweep ran or reused, for its closing and report."""
        ...

    def interrupted(self) -> None:
        """The sweep stops before its end: what the source holds in flight is let go."""
        ...


More = Callable[[Any], list["Point"]]  # after each step of the watch (its Flight): the points to run next


class GridSource:
    """The points Hydra expanded, all known at the start; points with the same config run once."""

    known_ahead = True

    def __init__(self, points: list[Point]) -> None:
        self.points = points

    def plan(self, runner: Runner, preview: bool = False) -> tuple[list[Point], dict[Shape, list[Point]]]:
        self.points, groups = distinct(self.points, plan(self.points, runner, preview))
        return self.points, groups

    def open(self, runner: Runner, planned: list[Point]) -> None:
        pass  # nothing to open: the points are the grid's

    def first(self, runner: Runner) -> list[Point]:
        return self.points

    @property
    def total(self) -> int:
        return len(self.points)

    def feed(self, record: Any, runner: Runner, sweep_id: str, done_before: dict[str, str]) -> More | None:
        return None

    def end(self, record: Any, runner: Runner, flight: Any, done_before: dict[str, str]) -> list[Point]:
        return self.points

    def interrupted(self) -> None:
        pass  # the runner ends the grid's workers
