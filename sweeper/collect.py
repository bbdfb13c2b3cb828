"""After the watch: each point's outcome, from its MLflow run and what its job said."""

from __future__ import annotations

from sweeper import display, job_end
from sweeper.point_files import link_rank_logs
from sweeper.points import Point
from sweeper.records import SweepRecord
from sweeper.watch import Flight
from trainer import metrics


def collect(
    record: SweepRecord,
    sweep_id: str,
    points: list[Point],
    done_before: dict[str, str],
    flight: Flight,
    earlier: dict[str, str] | None = None,
) -> list[display.Outcome]:
    """One outcome per point, in the sweep's order; ``done_before`` maps skipped points' hashes
    to their FINISHED runs, ``earlier`` watched points' names to their runs (an earlier sweep's
    children). A run a job left RUNNING is ended here, KILLED or FAILED."""
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
            if run is None and "CANCELLED" in str(error):  # its worker's allocation was cancelled first
                status = "KILLED"
            why = "\n".join(part for part in (job_end.one_line(error), job_end.cause(log)) if part)
            if status == "RUNNING":  # the job ended before its trainer could end the run: say how
                status = "KILLED" if "CANCELLED" in str(error) else "FAILED"
                record.client.set_tag(run.info.run_id, metrics.TAG_ERROR, why[-5000:])
                record.client.set_terminated(run.info.run_id, status)
                run = record.client.get_run(run.info.run_id)
            if error is not None and status == "FINISHED":
                status = "FAILED"
            text = ""
            if status != "FINISHED":
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
