"""A sweep's record opened in its store: the sweeps whose sweeper died closed, what earlier sweeps
finished (reused) or still train (watched), the parent run recorded, and each point's folder
written with its run's place in the store (sweeper/sweep.py calls it once the store is open).
"""

from __future__ import annotations

from pathlib import Path

from sweeper import display
from sweeper.plan.point_files import prepare
from sweeper.points import Point
from sweeper.runners.base import Runner
from sweeper.runners.earlier import EarlierJob
from sweeper.runners.warm import withdraw_unclaimed
from sweeper.track import ahead, records
from sweeper.track.records import SweepRecord
from sweeper.track.watch import Flight
from trainer import metrics
from trainer.record import provenance
from trainer.record.checkpoint import resume_key


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
