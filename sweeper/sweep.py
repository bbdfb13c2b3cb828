"""A sweep from start to end, in the order it happens:
plan -> (preview) -> resume -> submit -> watch -> collect -> summarise -> report.

conf -> expand (Hydra) -> plan resources (the launcher's runner) -> submit (submitit) -> collect (MLflow)
"""

from __future__ import annotations

import logging
import os
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sweeper import display, folders, timeline
from sweeper.config import validate_sweep
from sweeper.plan import cost
from sweeper.plan.preview import preview
from sweeper.plan.source import PointSource
from sweeper.points import Point
from sweeper.report import drawing
from sweeper.runners.base import Runner, SchedulerAwayError, make_runner
from sweeper.timeline import phase
from sweeper.track import ahead, offline_report, records, retime, sweep_file
from sweeper.track.collect import close_runs, spent, stopped_early
from sweeper.track.early_report import EarlyReport
from sweeper.track.handoff import HandoffSender
from sweeper.track.opening import open_sweep
from sweeper.track.records import SweepRecord
from sweeper.track.watch import Flight, interrupts_noted, watch
from trainer import data, limits
from trainer.core.clock import process_start
from trainer.errors import ConfigError, disk_full
from trainer.ranks.processes import owner
from trainer.record import journal, store, uri_check


def run_sweep(base: DictConfig, source: PointSource, sweep_dir: Path, overrides: list[str]) -> int:
    """Run the points ``source`` gives (a grid's, or a search's trials as it asks for them); the exit
    status: 0 all finished, 1 some failed, 130 interrupted."""
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)  # its errors reach us raised: said in a line
    sweep = Sweep(base, source, sweep_dir, overrides)
    groups, unchecked = sweep.check()
    if base.sweep.dry_run:
        preview(sweep.points, sweep.runner.preview(groups), unchecked, sweep.data_unchecked, *sweep.rates())
        return 0
    with phase("points: open"):  # a study that holds its trials already stops here, before any worker
        source.open(sweep.runner, sweep.points)
    try:
        sweep.start()
        flight = sweep.watch()
    except BaseException as e:  # e.g. the store refused the parent, sbatch refused a job, Ctrl-C
        return sweep.stopped(e)
    try:
        return sweep.end(flight)
    except BaseException as e:
        close_abandoned(sweep.record, sweep_dir, e)  # a full disk: its reserve given back for the store to close them
        raise


class Sweep:
    """One sweep as it goes: checked, its workers started and its parent recorded, watched, ended."""

    def __init__(self, base: DictConfig, source: PointSource, sweep_dir: Path, overrides: list[str]) -> None:
        self.base, self.opts, self.source = base, base.sweep, source
        self.sweep_dir, self.overrides = sweep_dir, overrides
        self.sweep_id = uuid.uuid4().hex[:8]
        # Set by check: the launcher's runner, the points (the source's), the store and experiment.
        self.runner: Runner
        self.points: list[Point] = []
        self.uri = self.experiment = ""
        # Set by start: the points to run, those finished before (hash -> run), an earlier sweep's live ones.
        self.todo: list[Point] = []
        self.done_before: dict[str, str] = {}
        self.earlier: dict[int, Any] = {}
        self.record: SweepRecord | None = None  # once the store is open
        self.flight_ahead: Flight | None = None  # a grid's points started before the store was open
        self.early: EarlyReport | None = None  # the report drawn while the points run
        self.data_unchecked = ""  # a preview's data it could not read here

    def check(self) -> tuple[dict, str]:
        """Every check before anything is submitted or recorded: the runner and the points' shapes,
        the data, the scheduler, the store. The points by shape, and what could not be checked here."""
        with phase("plan"):
            validate_sweep(self.base)
            self.runner = make_runner(self.base.launcher, self.sweep_dir, f"sweepscale-{self.sweep_id}")
            self.points, groups = self.source.plan(self.runner, preview=self.opts.dry_run)
        with phase("data check"):
            try:
                check_data(self.points)
            except ConfigError as e:  # a preview is for the machine that has the data: said, not refused
                if not self.opts.dry_run:
                    raise
                self.data_unchecked = str(e)
        with phase("scheduler and store checks"):
            unchecked = preflight(self.runner, self.points, self.opts.dry_run)
            self.uri = store.absolute_uri(store.tracking_uri(self.base.mlflow.tracking_uri))
            self.experiment = store.experiment_name(self.base.mlflow.experiment)
            uri_check.check_uri(self.uri)
        return groups, unchecked

    def rates(self) -> tuple[dict[tuple[str, ...], cost.Rate], str]:
        """What earlier runs in the store say the points' shapes cost, for the preview, and where from;
        a store that fails to answer leaves the estimate out."""
        where = f"{self.uri} (experiment {self.experiment})"
        store.bound_waits(uri_check.ANSWER_S)  # a preview ends here: a slow server slows no run
        try:
            return cost.rates(cost.measured(self.uri, self.experiment)), where
        except Exception as e:  # MLflow's errors are many: the preview goes on without the estimate
            display.console.print(f"[yellow]no estimate:[/yellow] {where}: {str(e).splitlines()[0][:200]}")
            return {}, where

    def start(self) -> None:
        """The workers started (a grid's points too, where they may go ahead of the store), the
        store opened, the first points asked for, the parent recorded and the points resumed."""
        runner, uri = self.runner, self.uri
        if not self.base.report.figures:
            drawing.turn_off("report.figures=false: python -m sweeper.report FOLDER draws it")
        with phase("workers' start"):
            os.environ[store.AHEAD] = uri  # the workers open it while they wait for their points
            os.environ[journal.HANDOFF_ENV] = "" if runner.checkpoints else "1"  # or hand their runs to this sweeper
            goes_ahead = self.source.known_ahead and ahead.possible(runner, self.points, uri)
            if not goes_ahead:  # the tickets wait for the store: MLflow's import (seconds) from now
                store.open_ahead()
            runner.prestart(self.points)  # warm workers start up while MLflow is imported and the parent recorded
            if goes_ahead:
                self.flight_ahead = ahead.start(runner, self.points, uri, self.experiment, self.sweep_id)
        # Else after the tickets, not beside Hydra's composition or the workers' start: in one GIL the
        # import slowed what the workers wait for (0.3-0.4 s) and ended no sooner itself.
        store.open_ahead()
        with phase("points: first"):  # a search's first trials; a worker per shape it holds starts meanwhile
            self.points = self.source.first(runner)
        self.keep_state()
        drawing.warm_up(early=True)  # the report's drawing children, where cores are left idle
        with phase("store: parent run, resume"):
            self.record = SweepRecord(uri, self.experiment, self.sweep_dir)
            self.todo, self.done_before, self.earlier = open_sweep(
                self.record, runner, self.sweep_id, self.points, self.sweep_dir, self.overrides, self.opts.force,
                self.flight_ahead,
            )  # fmt: skip

    def keep_state(self) -> None:
        """The sweep in its folder from now, for ``python -m sweeper.status`` (sweeper/track/sweep_file.py):
        points that go ahead of the store train before its parent run exists."""
        journals = self.runner.hands_off(self.points) or store.sqlite_file(self.uri) is None  # or spooled for a server
        name = records.parent_name(self.points, self.overrides)
        planned = records.points_json(self.points, {})
        sweep_file.keep(self.sweep_dir, sweep_id=self.sweep_id, name=name, status="RUNNING", points=planned,
                        journals=journals, sweeper=owner(), scheduler=self.runner.scheduler)  # fmt: skip

    def watch(self) -> Flight:
        """Run the points, and those the source gives as they end, to the last; the points in all."""
        record, runner, opts = self.record, self.runner, self.opts
        with phase("runs"):
            drawing.warm_up()  # or now, and the report's modules imported here while the points run
            drawing.warm_up_here()
            more = self.source.feed(record, runner, self.sweep_id, self.done_before)
            sender = HandoffSender(record, opts.poll_s)
            if self.source.known_ahead:
                self.early = EarlyReport(record, self.sweep_dir / "report", self.base.report.target)

            def each(flight: Flight) -> None:  # after every step of the watch
                sender(flight)
                if self.early is not None:
                    self.early(flight)

            try:
                flight = watch(
                    runner, self.todo, self.source.total, len(self.done_before), opts.poll_s, self.earlier, more, each,
                    self.flight_ahead,
                )  # fmt: skip
            finally:
                sender.stop()
            self.points = self.source.end(record, runner, flight, self.done_before)
        return flight

    def stopped(self, error: BaseException) -> int:
        """The sweep stops before its watch ended: what it started ends, no run stays RUNNING; 130 on
        Ctrl-C (with what the points ahead of the store did), else ``error`` raised again."""
        drawing.stop()
        self.runner.stop()  # the workers waiting for points end
        self.source.interrupted()
        if self.record is not None:
            close_abandoned(self.record, self.sweep_dir, error)
        if isinstance(error, KeyboardInterrupt):  # before the watch: points started ahead end KILLED in their workers
            display.console.print("[red]interrupted: the sweep's workers end their points[/red]")
            display.summary(stopped_early(self.points, self.flight_ahead))
            return 130
        raise error

    def end(self, flight: Flight) -> int:
        """After the watch: time again what had company, collect, summarise and report; the exit status."""
        record, runner, opts, sweep_dir = self.record, self.runner, self.opts, self.sweep_dir
        retimed = retime.Retimed()
        if self.source.known_ahead and opts.retime and not flight.interrupted:  # not a search's trials
            with phase("timed again alone"):
                retimed = retime.time_again(record, runner, self.sweep_id, self.points, opts.poll_s, opts.store_wait_s)
                flight.interrupted = retimed.interrupted
        with interrupts_noted() as stopped:  # from here a signal waits for the sweep's end: then 130
            with phase("collect"):
                outcomes, away = close_runs(
                    record, runner, self.sweep_id, self.points, self.done_before, flight, self.earlier, sweep_dir,
                    opts, retimed.runs,
                )  # fmt: skip
                ok = all(o.status in display.ENDED_WELL for o in outcomes)
            with phase("report"):
                ended = "KILLED" if flight.interrupted else "FINISHED" if ok else "FAILED"
                if self.early is not None:
                    self.early.wait()
                report = write_report(record, sweep_dir, self.base.report.target, None if away is None else ended)
                drawing.stop()
            display.summary(outcomes, report)  # with the report's speedups, diverged points and best
            for h in spent(outcomes, retimed.runs):  # beside the sweep's wall time
                display.console.print(f"held: {h.said()}, over {time.time() - process_start():.1f} s of the sweep")
            if allocated := runner.allocated():  # what the site bills: every allocation, requeued ones too
                display.console.print(f"allocated: {allocated}")
            if away is not None:
                said = str(away).splitlines()[0][:200]
                display.console.print(
                    f"[red]the tracking server at {record.uri} did not answer[/red] ({said}): what it lacks waits in "
                    f"journals under {sweep_dir} (the report below is built from them); when it is back, "
                    f"python -m sweeper.sync {sweep_dir} sends it and writes the report again from there"
                )
            display.closing(report, record.uri, record.experiment_id, record.parent_id)
            timeline.write(sweep_dir)
        return 130 if flight.interrupted or stopped else 0 if ok and away is None else 1


def close_abandoned(record: SweepRecord, sweep_dir: Path, error: BaseException) -> None:
    """No run of the sweep stays RUNNING after ``error``. On a full disk the folder's reserve is given
    back first, the store's room to close them, and the error becomes a DiskFullError saying whether it did."""
    if not (full := disk_full(error)):
        record.abandon(error)
        return
    folders.free_reserve(sweep_dir)
    why = f"the disk was full ({full}): what this run trained was not all recorded"
    why += f"; once space is free, python -m sweeper.sync {sweep_dir} sends what its journal holds"
    raise folders.DiskFullError(full, record.abandon(error, why)) from error


def preflight(runner: Runner, points: list[Point], dry_run: bool) -> str:
    """The runner's checks (Slurm: the partition, how ranks start); "" or, in a preview where the
    scheduler does not answer, what could not be checked."""
    try:
        runner.check(points)
    except SchedulerAwayError as e:  # a preview needs no cluster: it says what it could not check
        if not dry_run:
            raise
        return str(e)
    return ""


def check_data(points: list[Point]) -> None:
    """Check each distinct data set's files by their headers and sizes, and try each folder the runs
    write into (the reference cache), so that a bad folder or file stops the sweep before submission."""
    seen: set[tuple] = set()
    for p in points:
        d, c = p.trainer.data, p.trainer.check
        key = (d.dir, d.n_train, d.n_test)
        if key not in seen:
            seen.add(key)
            data.check(d.dir, d.n_train, d.n_test)
        if (c.reference, c.cache_dir) not in seen:
            seen.add((c.reference, c.cache_dir))
            limits.check_folders(p.trainer)


def write_report(record: SweepRecord, sweep_dir: Path, target: float | None = None, offline: str | None = None) -> Any:
    """The study report of what finished (also after Ctrl-C), or None: a failure here fails no point.
    ``offline``: the tracking server is away; the report comes from the points' journals, the
    parent ended so (sweeper/track/offline_report.py)."""
    drawing.imported()  # the report's modules, imported in a thread while the points ran
    from sweeper.report import report_for

    folder = sweep_dir / "report"
    try:
        if offline is not None:
            return offline_report.write(record, sweep_dir, offline, target)
        parent = record.client.get_run(record.parent_id)
        report = report_for(record.client, [parent], folder, target=target)
    except Exception:  # the points' runs are safe in the store: say what failed and how to retry
        where = traceback.format_exc().strip().splitlines()[-3:]
        display.console.print("[red]report not written:[/red] " + " | ".join(w.strip() for w in where))
        display.console.print("  retry with: python -m sweeper.report latest")
        return None
    return report
