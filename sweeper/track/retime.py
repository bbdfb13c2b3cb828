"""Points timed again alone at the sweep's end, so that no speedup rests on contended timings.

A point's timed batches may have had company: other runs' batches on its host (CPU runs, or GPU runs
sharing a GPU), other processes on its cores (trainer/ranks/contention.py), or whatever held one rank
back a tenth of each batch (sweeper/report/families.py company). Where every point of a
scaling family's nproc had, that nproc's first point runs once more once the sweep's points have
ended (sweep.retime): one epoch with perf.timing=exclusive, the host's timing lock its own, and
without the CPU check; the timing protocol's pass adds the steps its floor needs. Each runs after the
previous one ended, so that no start-up of one shares the cores of another's timed batches.

That run is a child of the sweep's parent of its own, named "<point> (timed alone)" and tagged with
the point's run (``sweepscale.timed_again_for``); once it FINISHED the point's run is tagged with it
(``sweepscale.timed_again_by``) and the report takes its timings for the point's
(sweeper/report/study.py). A retiming that fails leaves the point's own timings, flagged as before.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omegaconf import open_dict

from sweeper import display
from sweeper.plan.point_files import prepare
from sweeper.plan.shapes import plan
from sweeper.points import TIMED_ALONE, Point
from sweeper.report.families import company, to_time_alone
from sweeper.report.study import point_of
from sweeper.track.watch import watch
from trainer import metrics
from trainer.record import store

if TYPE_CHECKING:
    from sweeper.runners.base import Runner
    from sweeper.track.records import SweepRecord


def chosen(record: SweepRecord, sweep_id: str, points: list[Point]) -> list[tuple[Point, Any]]:
    """The points of this sweep to time again, each with its FINISHED run."""
    record.send_handed_off([p.dir for p in points], budget_s=None)  # what the watch left unsent (track/handoff.py)
    runs = record.children(sweep_id)
    ran = [(p, runs[p.name]) for p in points if p.name in runs and runs[p.name].info.status == "FINISHED"]
    ran = [(p, run) for p, run in ran if not p.shape.shared_cores]  # alone, its ranks would still share cores
    summaries = [point_of(run, p.name) for p, run in ran]
    return [ran[i] for i in to_time_alone(summaries)]


def alone(point: Point, run_id: str, index: int) -> Point:
    """The point's retiming: its config for one epoch, timed with the host to itself, unchecked."""
    t = copy.deepcopy(point.trainer)
    with open_dict(t):
        t.epochs = 1
        t.perf.timing = "exclusive"
        t.check.reference = False
        t.save.weights = False
        t.mlflow.tags = {**t.mlflow.tags, metrics.TAG_TIMED_AGAIN_FOR: run_id}
    where = point.dir.with_name(f"{point.dir.name}.alone")
    return Point(index, [*point.overrides, "epochs=1", "perf.timing=exclusive"], t, where, point.name + TIMED_ALONE)


@dataclass
class Retimed:
    """What the retimings left: their runs (as recorded: FINISHED or not), whether the sweep was
    stopped meanwhile."""

    runs: list[Any] = field(default_factory=list)
    interrupted: bool = False


def time_again(
    record: SweepRecord, runner: Runner, sweep_id: str, points: list[Point], poll_s: float, wait_s: float
) -> Retimed:
    """Time the chosen points again, one after another. Its failure fails no point (their runs are
    in the store): said in a line. ``wait_s``: the longest wait on a tracking server (sweep.store_wait_s)."""
    if record.uri.startswith(("http://", "https://")):  # a server gone by now costs seconds, not minutes
        store.bound_waits(wait_s)
    try:
        return _time_again(record, runner, sweep_id, points, poll_s)
    except KeyboardInterrupt:  # outside its watch (which ends its jobs itself): the workers end too
        runner.stop()
        return Retimed(interrupted=True)
    except Exception as e:
        why = "the tracking server did not answer" if store.server_away(e) else str(e).splitlines()[0][:200]
        display.console.print(f"[red]timing again alone failed[/red] ({why}); the points keep their own timings")
        return Retimed()


def _time_again(record: SweepRecord, runner: Runner, sweep_id: str, points: list[Point], poll_s: float) -> Retimed:
    out = Retimed()
    todo = chosen(record, sweep_id, points)
    if not todo:
        return out
    said = "; ".join(f"{p.name}: {' and '.join(company(point_of(run, p.name)))}" for p, run in todo)
    display.console.print(f"timing again alone, one at a time, the points whose nproc had company: {said}")
    first = max(p.index for p in points) + 1
    for i, (p, run) in enumerate(todo):
        again = alone(p, run.info.run_id, first + i)
        plan([again], runner)
        prepare(again, record.uri, record.experiment, record.parent_id, sweep_id, runner.checkpoints)
        runner.prestart([again])
        # Its run handed off once it ended, not while it trains: the sends would take its cores.
        flight = watch(runner, [again], 1, 0, poll_s, label=f"timing {p.name} alone")
        record.send_handed_off([again.dir], budget_s=None)  # a warm worker's journal, whole (sweeper/track/handoff.py)
        ended = record.children(sweep_id).get(again.name)
        if ended is not None:
            out.runs.append(ended)
        if flight.interrupted:
            out.interrupted = True
            break
        if ended is not None and ended.info.status == "FINISHED":
            record.client.set_tag(run.info.run_id, metrics.TAG_TIMED_AGAIN_BY, ended.info.run_id)
        else:
            why = "no run recorded" if ended is None else f"its run ended {ended.info.status}"
            display.console.print(f"[yellow]{again.name}[/yellow]: {why}; the point keeps its own timings")
    return out
