"""``python -m sweeper.status [SWEEP_ID|latest|FOLDER] [--report]``: a sweep's points from another terminal.

Each planned point queued (no run yet), running (epoch k of n, the time per epoch so far and an
ETA), finished (loss, precision), failed (its error's last line), or reused from an earlier sweep.
A sweep whose runs keep journals in its folder (local warm workers, or a tracking server) is read
from its own files (``sweep.json`` and the journals: sweeper/track/sweep_file.py), without MLflow;
any other from the tracking store (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db; ``--tracking-uri``).
``--report`` also builds the report of what has finished so far (``<sweep folder>/report-so-far``).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from rich.table import Table

from sweeper.display import console
from sweeper.points import TIMED_ALONE
from sweeper.report.__main__ import store_arguments
from sweeper.report.study import planned_points, series
from sweeper.runners import partition
from sweeper.track import sweep_file
from trainer import metrics
from trainer.lifecycle.queue_files import POINT_DATA
from trainer.ranks.processes import alive

COLOURS = {"queued": "dim", "running": "yellow", "finished": "green", "reused": "cyan"}


def point_state(run: dict[str, Any] | None, reused: bool) -> tuple[str, str]:
    """(state, what to say of it) of one planned point from its run (None: not started yet): its
    status, params, metrics (last values), tags and, running, its epochs' times so far (step, s)."""
    if run is None:
        return ("reused", "finished in an earlier sweep") if reused else ("queued", "")
    m, status, epoch_s = run["metrics"], run["status"], run["epoch_s"]
    epochs = int(run["params"].get("epochs", 0) or 0)
    if status == "RUNNING":
        if not epoch_s:
            return "running", f"before its first epoch of {epochs}"
        done = max(step for step, _s in epoch_s)
        per_epoch = statistics.median(v for _step, v in epoch_s)
        if epochs < done:  # its params not in the store yet (a handed-off run's lines come in turn)
            return "running", f"epoch {done}, {per_epoch:.2f} s each"
        return "running", f"epoch {done} of {epochs}, {per_epoch:.2f} s each, ETA {per_epoch * (epochs - done):.0f} s"
    if status == "FINISHED":
        loss, prec = m.get(metrics.TRAIN_LOSS_EPOCH), m.get(metrics.TEST_PRECISION)
        text = "" if loss is None else f"loss {loss:.4f}"
        return "finished", text + ("" if prec is None else f", precision {prec:.4f}")
    error = run["tags"].get(metrics.TAG_ERROR, "").strip().splitlines()
    return status.lower(), error[-1] if error else ""


def file_rows(folder: Path) -> tuple[str, list[tuple[str, str, str]]]:
    """The title and (point, state, detail) rows of the sweep in ``folder``, from its own files."""
    state = sweep_file.read(folder) or {}
    runs = sweep_file.runs(folder)
    status = state.get("status", "RUNNING")
    host, _, pid = state.get("sweeper", "").partition(" ")
    if status == "RUNNING" and host == socket.gethostname() and pid.isdigit() and not alive(int(pid)):
        status = f"RUNNING, but its sweeper (pid {pid}) is gone: the next sweep here closes its runs"
    rows = []
    planned = state.get("points", [])
    asked = {e["name"] for e in planned}  # a search's trials come as it asks them: those with a journal too
    for entry in planned + [{"name": n} for n in runs if n not in asked and not n.endswith(TIMED_ALONE)]:
        run = runs.get(entry["name"])
        point, detail = point_state(run, bool(entry.get("reused_run")))
        if run is not None and run["status"] == "RUNNING" and status != "RUNNING":
            point, detail = "unended", f"its journal has no end; the sweep ended {status}"
        rows.append((entry["name"], point, detail))
    return f"sweep {state.get('sweep_id')}: {state.get('name')} ({status})", rows


def slurm_jobs(folder: Path | None) -> dict[str, str]:
    """Each started point's Slurm job (from the link to its log, ``<job>_0_log.out``) and what Slurm
    says of it now: one squeue call, and sacct's for the jobs that ended."""
    ids: dict[str, str] = {}
    for point_dir in folder.iterdir() if folder is not None and folder.is_dir() else ():
        link, config = point_dir / "stdout.log", point_dir / POINT_DATA
        if link.is_symlink() and config.exists():
            ids[json.loads(config.read_text())["mlflow"]["run_name"]] = link.resolve().name.split("_0_log")[0]
    said = partition.job_states(list(ids.values()))
    return {name: f"{job} {said.get(job, '')}".strip() for name, job in ids.items()}


def mlflow_run(client: Any, run: Any) -> dict[str, Any]:
    """What point_state reads of an MLflow run (its epoch times sampled: epochs=100000 reads 2000)."""
    epoch_s = series(client, run.info.run_id, metrics.EPOCH_TIME) if run.info.status == "RUNNING" else []
    d = run.data
    return {"status": run.info.status, "params": d.params, "metrics": d.metrics, "tags": d.tags, "epoch_s": epoch_s}


def status_rows(client: Any, parent: Any) -> list[tuple[str, str, str]]:
    """(point, state, detail) for every planned point of the sweep of ``parent``."""
    sweep_id = parent.data.tags.get(metrics.TAG_SWEEP_ID, "")
    kids = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`{metrics.TAG_SWEEP_ID}` = '{sweep_id}'", max_results=50000
    )
    own = {r.info.run_name: r for r in kids if r.info.run_id != parent.info.run_id}
    planned = planned_points(client, parent.info.run_id) or [{"name": n} for n in sorted(own)]
    rows = []
    for entry in planned:
        run = own.get(entry["name"])
        point = point_state(None if run is None else mlflow_run(client, run), bool(entry.get("reused_run")))
        rows.append((entry["name"], *point))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeper.status", description=__doc__.split("\n")[0])
    parser.add_argument(
        "sweep", nargs="?", default="latest", metavar="SWEEP_ID", help="a sweep id, 'latest', or a sweep's folder"
    )
    store_arguments(parser)
    parser.add_argument("--report", action="store_true", help="also build the report of what has finished so far")
    args = parser.parse_args(argv)
    own_store = args.tracking_uri is None and args.experiment is None  # else: that store's sweeps
    folder = sweep_file.find(args.sweep, Path.cwd()) if own_store and not args.report else None
    if folder is not None:
        title, rows = file_rows(folder)
        scheduler = (sweep_file.read(folder) or {}).get("scheduler", "")
    else:
        from sweeper.report.__main__ import find_parents, open_experiment

        client, experiment_id = open_experiment(args, [args.sweep])
        (parent,) = find_parents(client, experiment_id, [args.sweep])
        rows = status_rows(client, parent)
        title = f"sweep {parent.data.tags.get(metrics.TAG_SWEEP_ID)}: {parent.info.run_name} ({parent.info.status})"
        scheduler, where = parent.data.tags.get(metrics.TAG_SCHEDULER, ""), parent.data.tags.get(metrics.TAG_SWEEP_DIR)
        folder = Path(where) if where else None
    jobs = slurm_jobs(folder) if scheduler == "slurm" else {}  # job ids, states and pending reasons (#50)
    table = Table(title=title)
    for col in ("point", "state", "", *(["Slurm job"] if jobs else [])):
        table.add_column(col, overflow="fold")
    for point, state, detail in rows:
        colour = COLOURS.get(state, "red")
        table.add_row(point, f"[{colour}]{state}[/{colour}]", detail, *([jobs.get(point, "")] if jobs else []))
    console.print(table)
    counts = Counter(state for _p, state, _d in rows)
    console.print("  ".join(f"{s} {n}" for s, n in counts.items()) + f"  of {len(rows)}")
    if args.report:
        from sweeper.report import report_for
        from sweeper.report.__main__ import default_folder

        folder = default_folder([parent]).parent / "report-so-far"
        report = report_for(client, [parent], folder, attach=False)
        console.print(f"report so far ({len(report.rows)} point(s)): {(folder / 'report.html').resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
