"""After the watch: each point's outcome, from its MLflow run and what its job said, and the parent run ended."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from sweeper import display
from sweeper.job import job_end
from sweeper.plan.point_files import link_rank_logs
from sweeper.points import Point
from sweeper.report import resources
from sweeper.runners.base import Runner
from sweeper.track.records import PARENT_JOURNAL, SweepRecord
from sweeper.track.watch import Flight
from trainer import metrics
from trainer.record import journal, store


def collect(
    record: SweepRecord,
    sweep_id: str,
    points: list[Point],
    done_before: dict[str, str],
    flight: Flight,
    sweep_dir: Path,
    earlier: dict[str, str] | None = None,
) -> list[display.Outcome]:
    """One outcome per point, in the sweep's order; ``done_before`` maps skipped points' hashes
    to their FINISHED runs, ``earlier`` watched points' names to their runs (an earlier sweep's
    children). A run a job left RUNNING is ended here, KILLED or FAILED, saying how to send what
    its journal still holds (in ``sweep_dir``)."""
    children = record.children(sweep_id)
    children.update({name: record.client.get_run(run_id) for name, run_id in (earlier or {}).items()})
    outcomes = []
    for p in points:
        if p.config_hash in done_before:
            run = record.client.get_run(done_before[p.config_hash])
            outcomes.append(display.Outcome(p.name, "SKIPPED", run))
            continue
        run = children.get(p.name)
        log = flight.logs.get(p.index, "")
        link_rank_logs(p, log)
        if p in flight.queued:
            outcomes.append(display.Outcome(p.name, "CANCELLED", run, "never started", log))
        elif p.index in flight.running:
            status = run.info.status if run is not None else "KILLED"
            why = "the sweep was stopped while it trained (Ctrl-C or SIGTERM)" if flight.interrupted else ""
            outcomes.append(display.Outcome(p.name, "KILLED" if status == "RUNNING" else status, run, why, log))
        else:
            error = flight.finished.get(p.index)
            if run is None and error is None:  # the job said nothing went wrong, yet nothing was recorded
                error = RuntimeError(f"no run recorded: the job ended without error but no MLflow run names {p.name}")
            status = run.info.status if run is not None else "FAILED"
            if run is None and job_end.cancelled(error):  # its worker's allocation was cancelled first
                status = "KILLED"
            why = "\n".join(part for part in (job_end.one_line(error), job_end.cause(log)) if part)
            if status == "RUNNING":  # the job ended before its trainer could end the run: say how
                status = "KILLED" if job_end.cancelled(error) else "FAILED"
                if (p.dir / journal.FILE).exists():  # not all sent (a full disk)
                    why += f"\nwhat its journal holds is not all recorded: python -m sweeper.sync {sweep_dir} sends it"
                record.client.set_tag(run.info.run_id, metrics.TAG_ERROR, why[-5000:])
                record.client.set_terminated(run.info.run_id, status)
                run = record.client.get_run(run.info.run_id)
            if error is not None and status == "FINISHED":
                status = "FAILED"
            if status == "KILLED" and error is None and run is not None and metrics.TAG_STOPPED in run.data.tags:
                status = "PRUNED"  # a search stopped it between epochs (sweeper/search/study.py): no failure
            text = ""
            if status == "PRUNED":
                text = run.data.tags[metrics.TAG_STOPPED]
            elif status != "FINISHED":
                text = (run.data.tags.get(metrics.TAG_ERROR, "") if run is not None else "") or why
            outcomes.append(display.Outcome(p.name, status, run, text, log))
    return outcomes


def offline(points: list[Point], done_before: dict[str, str], flight: Flight) -> list[display.Outcome]:
    """Each point's outcome from what its job said alone (the tracking server did not answer): a
    status and the job's error, no run."""
    outcomes = []
    for p in points:
        log = flight.logs.get(p.index, "")
        if p.config_hash in done_before:
            outcomes.append(display.Outcome(p.name, "SKIPPED"))
        elif p in flight.queued:
            outcomes.append(display.Outcome(p.name, "CANCELLED", None, "never started", log))
        elif p.index in flight.running:
            outcomes.append(display.Outcome(p.name, "KILLED", None, "", log))
        else:
            error = flight.finished.get(p.index)
            status, why = ("FAILED", job_end.one_line(error)) if error is not None else ("FINISHED", "")
            outcomes.append(display.Outcome(p.name, status, None, why, log))
    return outcomes


def close_runs(
    record: SweepRecord,
    runner: Runner,
    sweep_id: str,
    points: list[Point],
    done_before: dict,
    flight: Any,
    earlier: dict,
    sweep_dir: Path,
    opts: DictConfig,
    also: list[Any] = (),
) -> tuple[list, Exception | None]:
    """Each point's outcome, read from the store (or, the tracking server away, from the jobs), and
    the parent run ended; the server's error where it did not answer, else None. ``also``: the
    sweep's other runs, whose devices count in its totals (sweeper/track/retime.py)."""
    away: Exception | None = None
    try:
        if record.uri.startswith(("http://", "https://")):  # what points left while the server was away
            store.bound_waits(opts.store_wait_s)  # from here on the sweep's end waits a bounded time
            for path, what in journal.send_left(sweep_dir):
                display.console.print(f"tracking journal of {path.parent.name}: {what}")
        else:  # runs warm workers handed off that the watch has not sent in full (a worker killed mid-run)
            for path, what in journal.send_left(sweep_dir):
                if not what.startswith("sent"):
                    display.console.print(f"handed-off run of {path.parent.name}: {what}")
        if flight.interrupted:
            record.kill_running(sweep_id)  # runs whose trainer could not say so
        watched = {p.name: j.run_id for p, j in earlier.values()}
        outcomes = collect(record, sweep_id, points, done_before, flight, sweep_dir, watched)
    except Exception as e:
        if not store.server_away(e):
            raise
        away, outcomes = e, offline(points, done_before, flight)
    if away is None:  # the sweep's GPU-seconds (core-seconds) on its parent run
        try:
            record.log_parent(resources.parent_metrics(spent(outcomes, also)))
        except Exception as e:  # the server went away just now: the closing lines still say them
            if not store.server_away(e):
                raise
            away = e
    add_jobs(runner, outcomes)
    ok = all(o.status in display.ENDED_WELL for o in outcomes)
    away = end_parent(record, "KILLED" if flight.interrupted else "FINISHED" if ok else "FAILED", sweep_dir, away)
    return outcomes, away


def spent(outcomes: list[display.Outcome], also: list[Any] = ()) -> list[resources.Held]:
    """What this sweep's runs held (a point it skipped was paid for by an earlier sweep); ``also``:
    its other runs (the points it timed again alone, sweeper/track/retime.py)."""
    ran = [o.run for o in outcomes if o.run is not None and o.status != "SKIPPED"] + list(also)
    return resources.held((int(r.data.params.get("nproc", 1)), r.data.metrics) for r in ran)


def end_parent(record: SweepRecord, status: str, sweep_dir: Path, away: Exception | None) -> Exception | None:
    """End the parent run, or, the tracking server away, journal its end for `python -m sweeper.sync`."""
    if away is None:
        try:
            record.end_parent(status)
            return None
        except Exception as e:
            if not store.server_away(e):
                raise
            away = e
    journal.Journal(sweep_dir / PARENT_JOURNAL, record.uri, record.parent_id).append({"op": "end", "status": status})
    return away


def add_jobs(runner: Runner, outcomes: list[display.Outcome]) -> None:
    """Each run's scheduler job (the tags its trainer set: an array task as sacct names it, 30_0, else
    the job id) and what the scheduler says of it: its state, time and nodes; a warm worker's job
    serves other points too, so its state is its allocation's (a NODE_FAIL, a TIMEOUT), said so."""
    ids = {}
    for o in outcomes:
        if o.run is not None:
            tags = o.run.data.tags
            ids[o.name] = tags.get(metrics.TAG_SLURM_ARRAY) or tags.get(metrics.TAG_SLURM_JOB)
    accounts = runner.accounting([i for i in ids.values() if i])
    for o in outcomes:
        if ids.get(o.name):
            warm = o.run.data.tags.get(metrics.TAG_WARM) == "true"
            o.job = f"{ids[o.name]} {accounts.get(ids[o.name], '')}{' (warm worker)' if warm else ''}".strip()


def stopped_early(points: list[Point], ahead_of_store: Flight | None) -> list[display.Outcome]:
    """The closing table of a sweep stopped before its watch: the points its workers had begun
    ahead of the store end KILLED there, the others never started."""
    begun = {p.index for p in ahead_of_store.started.values()} if ahead_of_store is not None else set()
    return [
        display.Outcome(p.name, "KILLED", None, "the sweep was stopped while it trained")
        if p.index in begun
        else display.Outcome(p.name, "CANCELLED", None, "never started")
        for p in points
    ]
