"""A search as the sweep's source of points (sweeper/plan/source.py): its checks, its first trials,
a trial per freed worker, its end. The study's own rules live in sweeper/search/study.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sweeper import display
from sweeper.plan.point_files import prepare
from sweeper.plan.shapes import plan
from sweeper.plan.source import More
from sweeper.points import Point, Shape
from sweeper.runners.base import Runner, Streaming
from sweeper.search.space import overrides
from trainer import metrics
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from sweeper.search.study import Search
    from sweeper.track.records import SweepRecord
    from sweeper.track.watch import Flight

NEEDS = "hydra/sweeper=search runs its trials on warm workers: set launcher.warm=true (the default)"


class SearchSource:
    """A search's trials, asked of its study as workers free; none is known ahead."""

    known_ahead = False

    def __init__(self, search: Search) -> None:
        self.search = search

    def plan(self, runner: Runner, preview: bool = False) -> tuple[list[Point], dict[Shape, list[Point]]]:
        points = corners(self.search, runner)  # the space's ends stand for every trial in the checks
        return points, plan(points, runner, preview)

    def open(self, runner: Runner, planned: list[Point]) -> None:
        open_study(self.search, runner, planned)

    def first(self, runner: Runner) -> list[Point]:
        return first(self.search, runner)

    @property
    def total(self) -> int:
        return self.search.opts.n_trials

    def feed(self, record: SweepRecord, runner: Runner, sweep_id: str, done_before: dict[str, str]) -> More:
        return feed(self.search, record, runner, sweep_id, done_before)

    def end(self, record: SweepRecord, runner: Runner, flight: Flight, done_before: dict[str, str]) -> list[Point]:
        return end(self.search, record, runner, flight, done_before)

    def interrupted(self) -> None:
        if self.search.study is not None:
            self.search.interrupted()


def corners(search: Search, runner: Runner) -> list[Point]:
    """A point per end of the space (each choice, each interval's ends; the other values at their
    first): the sweep's checks stand them in for every trial, none runs; the runner's prestart
    then opens a streaming queue for each of their shapes, a worker each."""
    from optuna.distributions import CategoricalDistribution

    if not isinstance(runner, Streaming) or not runner.stream():
        raise ConfigError(NEEDS)
    ends = {
        k: list(d.choices) if isinstance(d, CategoricalDistribution) else [d.low, d.high]
        for k, d in search.space.items()
    }
    first = {k: v[0] for k, v in ends.items()}
    out: list[Point] = []
    for key, values in ends.items():
        for value in values:
            params = overrides({**first, key: value})
            out.append(search.make_point(-1 - len(out), [*search.fixed, *params], ",".join(params)))
    return out


def open_study(search: Search, runner: Streaming, planned: list[Point]) -> None:
    """Open the study, to keep as many trials in flight as the machine runs at once (GPUs, or
    cores on CPU: the units of the checked points' shapes) and one more; a ConfigError where it
    already holds its trials."""
    width = runner.units(planned[0].shape) + 1  # one more waits: a worker that frees takes it at once
    again = search.open(width)
    if search.left() == 0:
        raise ConfigError(
            f"study {search.name} in {search.storage} already holds its {search.opts.n_trials} trials; "
            f"raise hydra.sweeper.n_trials to search on. {search.summary()}"
        )
    display.console.print(
        f"study {search.name} in {search.storage}: {search.counted()} of {search.opts.n_trials} trials done"
        + (f", {again} interrupted trial(s) asked again" if again else "")
        + f"; {width} in flight"
    )


def first(search: Search, runner: Runner) -> list[Point]:
    """The study's first trials of this sweep, planned."""
    points: list[Point] = []
    while not points and search.left() > 0:
        points = _planned(search, runner, search.ask(search.width))
    if not points:
        raise ConfigError(f"no trial of study {search.name} could run (each said why above)")
    return points


def feed(search: Search, record: SweepRecord, runner: Runner, sweep_id: str, done_before: dict[str, str]) -> More:
    """The watch's ``more``: each ended trial told, new ones asked, planned and written. A trial
    whose config a FINISHED run already has is told that run's value and not run again (it joins
    ``done_before``, as a resumed grid point would)."""
    for p in list(search.points):
        if p.config_hash in done_before:
            search.tell(p, record.client.get_run(done_before[p.config_hash]), None)

    def run_of(point: Point) -> Any:
        record.send_handed_off([point.dir], budget_s=None)  # its worker's journal, whole (sweeper/track/handoff.py)
        return record.children(sweep_id).get(point.name)

    def ready(new: list[Point]) -> list[Point]:
        kept = _planned(search, runner, new)
        finished = record.finished_hashes() if kept else {}
        out = []
        for p in kept:
            if p.config_hash in finished:
                done_before[p.config_hash] = finished[p.config_hash]
                display.console.print(f"trial {p.index}: the same config as run {finished[p.config_hash]}, its value")
                search.tell(p, record.client.get_run(finished[p.config_hash]), None)
                continue
            prepare(p, record.uri, record.experiment, record.parent_id or "", sweep_id, runner.checkpoints)
            out.append(p)
        return out

    return lambda flight: search.step(flight.finished, run_of, ready)


def _planned(search: Search, runner: Runner, new: list[Point]) -> list[Point]:
    """The new trials that plan (valid, a shape here); the others told failed, with their reason."""
    out = []
    for p in new:
        try:
            plan([p], runner)
        except ConfigError as e:
            search.fail(p, e)
            continue
        out.append(p)
    return out


def end(
    search: Search, record: SweepRecord, runner: Streaming, flight: Flight, done_before: dict[str, str]
) -> list[Point]:
    """The queues sealed (idle workers end), trials in flight at an interrupt asked again next
    time, the parent's list of points and its best value; every point this sweep asked for."""
    runner.end_stream()
    if flight.interrupted:
        search.interrupted()
    record.replan(search.points, done_before)
    importance = search.importances()
    record.client.set_tag(record.parent_id, metrics.TAG_SEARCH, search.describe(importance))
    best = search.best()
    values = {f"search/importance/{k}": v for k, v in importance.items()}
    record.log_parent(values | ({} if best is None else {"search/best": best}))
    display.console.print(search.summary())
    return search.points
