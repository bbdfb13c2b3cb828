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
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from sweeper import display, folders, timeline
from sweeper.config import validate_sweep
from sweeper.plan.point_files import prepare
from sweeper.plan.shapes import distinct, plan
from sweeper.points import Point
from sweeper.report import drawing
from sweeper.runners.base import Runner, SchedulerAwayError, make_runner
from sweeper.runners.earlier import EarlierJob
from sweeper.runners.warm import withdraw_unclaimed
from sweeper.search import flow as search_flow
from sweeper.timeline import phase
from sweeper.track import ahead, offline_report, records, retime
from sweeper.track.collect import close_runs, spent, stopped_early
from sweeper.track.early_report import EarlyReport
from sweeper.track.handoff import HandoffSender
from sweeper.track.records import SweepRecord
from sweeper.track.watch import Flight, interrupts_noted, watch
from trainer import data, limits, metrics
from trainer.core.clock import process_start
from trainer.errors import disk_full
from trainer.record import journal, provenance, store, uri_check
from trainer.record.checkpoint import resume_key

if TYPE_CHECKING:
    from sweeper.search.study import Search


def run_sweep(
    base: DictConfig, points: list[Point], sweep_dir: Path, overrides: list[str], search: Search | None = None
) -> int:
    """Run the points Hydra expanded, or a ``search``'s trials as it asks for them; the exit status:
    0 all finished, 1 some failed, 130 interrupted."""
    launcher, opts = base.launcher, base.sweep
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)  # its errors reach us raised: said in a line
    with phase("plan"):  # every check before anything is submitted or recorded
        validate_sweep(base)
        sweep_id = uuid.uuid4().hex[:8]
        runner = make_runner(launcher, sweep_dir, f"sweepscale-{sweep_id}")
        if search is not None:  # the space's ends stand for every trial in the checks, and run not
            points = search_flow.corners(search, runner)
        groups = plan(points, runner)
        if search is None:
            points, groups = distinct(points, groups)
    with phase("data check"):
        check_data(points)
    with phase("scheduler and store checks"):
        unchecked = preflight(runner, points, opts.dry_run)
        uri = store.absolute_uri(store.tracking_uri(base.mlflow.tracking_uri))
        experiment = store.experiment_name(base.mlflow.experiment)
        uri_check.check_uri(uri)
    if opts.dry_run:
        preview(points, runner.preview(groups), unchecked)
        return 0
    if search is not None:  # a study that holds its trials already stops here, before any worker
        with phase("study: open"):
            search_flow.open_study(search, runner, points)

    record, early, flight_ahead = None, None, None
    try:
        with phase("workers' start"):
            os.environ[store.AHEAD] = uri  # the workers open it while they wait for their points
            os.environ[journal.HANDOFF_ENV] = "" if runner.checkpoints else "1"  # or hand their runs to this sweeper
            goes_ahead = search is None and ahead.possible(runner, points, uri)
            if not goes_ahead:  # the tickets wait for the store: MLflow's import (seconds) from now
                store.open_ahead()
            runner.prestart(points)  # warm workers start up while MLflow is imported and the parent recorded
            flight_ahead = ahead.start(runner, points, uri, experiment, sweep_id) if goes_ahead else None
        # Else after the tickets, not beside Hydra's composition or the workers' start: in one GIL the
        # import slowed what the workers wait for (0.3-0.4 s) and ended no sooner itself.
        store.open_ahead()
        if search is not None:  # a worker per shape the space holds starts meanwhile
            with phase("study: first trials"):
                points = search_flow.first(search, runner)
        drawing.warm_up(early=True)  # the report's drawing children, where cores are left idle
        with phase("store: parent run, resume"):
            record = SweepRecord(uri, experiment)
            todo, done_before, earlier = open_sweep(
                record, runner, sweep_id, points, sweep_dir, overrides, opts.force, flight_ahead
            )
        with phase("runs"):
            drawing.warm_up()  # or now, and the report's modules imported here while the points run
            drawing.warm_up_here()
            more = None if search is None else search_flow.feed(search, record, runner, sweep_id, done_before)
            total = len(points) if search is None else search.opts.n_trials
            sender = HandoffSender(record, opts.poll_s)
            early = EarlyReport(record, sweep_dir / "report", base.report.target) if search is None else None

            def each(flight: Flight) -> None:  # after every step of the watch
                sender(flight)
                if early is not None:
                    early(flight)

            try:
                flight = watch(runner, todo, total, len(done_before), opts.poll_s, earlier, more, each, flight_ahead)
            finally:
                sender.stop()
            if search is not None:
                points = search_flow.end(search, record, runner, flight, done_before)
    except BaseException as e:  # e.g. the store refused the parent, sbatch refused a job
        drawing.stop()
        runner.stop()  # the workers waiting for points end
        if search is not None and search.study is not None:
            search.interrupted()
        if record is not None:
            close_abandoned(record, sweep_dir, e)  # no run of this sweep stays RUNNING
        if isinstance(e, KeyboardInterrupt):  # before the watch: points started ahead end KILLED in their workers
            display.console.print("[red]interrupted: the sweep's workers end their points[/red]")
            display.summary(stopped_early(points, flight_ahead))
            return 130
        raise
    try:
        retiming = search is None and base.sweep.retime  # a search's trials are not timed again
        ended = (flight, earlier, early, retiming)
        return end_sweep(base, record, runner, sweep_id, points, done_before, sweep_dir, *ended)
    except BaseException as e:
        close_abandoned(record, sweep_dir, e)  # a full disk: its reserve given back for the store to close them
        raise


def end_sweep(
    base: DictConfig,
    record: SweepRecord,
    runner: Runner,
    sweep_id: str,
    points: list[Point],
    done_before: dict[str, str],
    sweep_dir: Path,
    flight: Flight,
    earlier: dict[int, tuple[Point, EarlierJob]],
    early: EarlyReport | None,
    retiming: bool,
) -> int:
    """After the watch: time again what had company, collect, summarise and report; the exit status."""
    opts = base.sweep
    retimed = retime.Retimed()
    if retiming and not flight.interrupted:
        with phase("timed again alone"):
            retimed = retime.time_again(record, runner, sweep_id, points, opts.poll_s, opts.store_wait_s)
            flight.interrupted = retimed.interrupted
    with interrupts_noted() as stopped:  # from here a signal waits for the sweep's end: then 130
        with phase("collect"):
            outcomes, away = close_runs(
                record, runner, sweep_id, points, done_before, flight, earlier, sweep_dir, opts, retimed.runs
            )
            ok = all(o.status in display.ENDED_WELL for o in outcomes)
        with phase("report"):
            ended = "KILLED" if flight.interrupted else "FINISHED" if ok else "FAILED"
            if early is not None:
                early.wait()
            report = write_report(record, sweep_dir, base.report.target, offline=None if away is None else ended)
            drawing.stop()
        display.summary(outcomes, report)  # with the report's speedups, diverged points and best
        for h in spent(outcomes, retimed.runs):  # beside the sweep's wall time
            display.console.print(f"held: {h.said()}, over {time.time() - process_start():.1f} s of the sweep")
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


def open_sweep(
    record: SweepRecord,
    runner: Runner,
    sweep_id: str,
    points: list[Point],
    sweep_dir: Path,
    overrides: list[str],
    force: bool,
    ahead_of_store: Flight | None = None,
) -> tuple[list[Point], dict[str, str], dict[int, tuple[Point, EarlierJob]]]:
    """Close the sweeps whose sweeper died, find what earlier sweeps finished or still train, record
    the parent run and write each point's config (``ahead_of_store``: written, its points started
    before the store was open, sweeper/track/ahead.py): the points to run, the hashes of those done
    before (-> their runs) and the points an earlier sweep's live job trains (index -> its job)."""
    closed, going_on = record.close_orphans(runner.live)
    for dead_id, folder in closed:  # its live jobs end after the points they train: this sweep runs the rest
        cancelled = runner.cancel_pending(f"sweepscale-{dead_id}")
        withdraw_unclaimed(Path(folder))
        said = f"; its pending jobs {', '.join(cancelled)} cancelled" if cancelled else ""
        display.console.print(f"sweep {folder}: its sweeper is gone; its runs left RUNNING are now KILLED{said}")
    done_before = resume(record, points, force)
    earlier = {
        p.index: (p, EarlierJob(record.client, *going_on[p.config_hash], runner.live))
        for p in points
        if p.config_hash in going_on and p.config_hash not in done_before
    }
    for p, job in earlier.values():
        display.console.print(f"watch {p.name}: run {job.run_id} goes on in job {job.job_id} of an earlier sweep")
    todo = [p for p in points if p.config_hash not in done_before and p.index not in earlier]
    reused = {**done_before, **{p.config_hash: job.run_id for p, job in earlier.values()}}
    parent_id = start_parent(record, runner, sweep_id, points, reused, sweep_dir, overrides)
    display.console.print(
        f"sweep {sweep_id}: {len(todo)} point(s) to run, MLflow parent run {parent_id}, folder {sweep_dir}"
    )
    display.console.print(f"ranks start: {runner.ranks_start}")
    if ahead_of_store is not None:  # a new store: nothing above was found
        ahead.tell_parent(ahead_of_store, parent_id)
        return todo, done_before, earlier
    stopped = record.checkpointed({p.config_hash: resume_key(p.trainer) for p in todo}) if runner.checkpoints else {}
    for p in todo:
        run_id, folder, epoch = stopped.get(p.config_hash, ("", "", 0))
        if run_id:
            display.console.print(f"resume {p.name}: run {run_id} goes on from its checkpoint of epoch {epoch}")
        prepare(p, record.uri, record.experiment, parent_id, sweep_id, runner.checkpoints, folder)
    return todo, done_before, earlier


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


def preview(points: list[Point], scripts: dict[str, str], unchecked: str = "") -> None:
    """The dry run's table of points and resources, what the runner would submit, and what could not
    be checked here (the scheduler does not answer)."""
    rows = [(p.name, p.nproc, p.shape.describe(), str(p.index)) for p in points]
    display.preview(rows, scripts)
    if unchecked:
        display.console.print(
            f"[yellow]not checked:[/yellow] {unchecked}. The partition's limits are unknown here: what the "
            "launcher keys leave null is assumed (a point's ranks on one node, one GPU each unless device=cpu; "
            "set launcher.gpus_per_node, ranks_per_node, max_nodes to preview others)."
        )


def resume(record: SweepRecord, points: list[Point], force: bool) -> dict[str, str]:
    """config hash -> the FINISHED run a point reuses (none with --force)."""
    finished = {} if force else record.finished_hashes()
    done_before = {}
    for p in points:
        if p.config_hash in finished:
            done_before[p.config_hash] = finished[p.config_hash]
            display.console.print(
                f"skip {p.name}: FINISHED run {done_before[p.config_hash]} has the same config (--force reruns)"
            )
    return done_before


def start_parent(
    record: SweepRecord,
    runner: Runner,
    sweep_id: str,
    points: list[Point],
    done_before: dict[str, str],
    sweep_dir: Path,
    overrides: list[str],
) -> str:
    """The sweep's parent run, listing every point (and the run a skipped one reuses)."""
    planned = records.points_json(points, done_before)
    extra = {
        metrics.TAG_COMMAND: records.command_line(),
        metrics.TAG_SWEEP_DIR: str(sweep_dir),
        metrics.TAG_RANKS_START: runner.ranks_start,
        **provenance.code_tags(),
    }
    return record.start_parent(
        sweep_id, records.parent_name(points, overrides), overrides, planned, runner.scheduler, extra
    )


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
