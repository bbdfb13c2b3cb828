"""``python -m sweeper.status [SWEEP_ID|latest] [--report]``: a sweep's points from another terminal.

Reads only the tracking store (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db; ``--tracking-uri``):
each planned point queued (no run yet), running (epoch k of n, the time per epoch so far and an
ETA), finished (loss, precision), failed (its error's last line), or reused from an earlier sweep.
``--report`` also builds the report of what has finished so far (``<sweep folder>/report-so-far``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from typing import Any

from rich.table import Table

from sweeper.display import console
from sweeper.report.__main__ import default_folder, find_parents, open_experiment, store_arguments
from sweeper.report.study import planned_points, series
from trainer import metrics

COLOURS = {"queued": "dim", "running": "yellow", "finished": "green", "reused": "cyan"}


def point_state(run: Any | None, reused: bool, epoch_s: list[tuple[int, float]]) -> tuple[str, str]:
    """(state, what to say of it) of one planned point from its run (None: not started yet) and,
    running, its epochs' times so far (step: epoch)."""
    if run is None:
        return ("reused", "finished in an earlier sweep") if reused else ("queued", "")
    m, status = run.data.metrics, run.info.status
    epochs = int(run.data.params.get("epochs", 0) or 0)
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
    error = run.data.tags.get(metrics.TAG_ERROR, "").strip().splitlines()
    return status.lower(), error[-1] if error else ""


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
        epoch_s = []
        if run is not None and run.info.status == "RUNNING":
            epoch_s = series(client, run.info.run_id, metrics.EPOCH_TIME)  # sampled: epochs=100000 reads 2000
        rows.append((entry["name"], *point_state(run, bool(entry.get("reused_run")), epoch_s)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeper.status", description=__doc__.split("\n")[0])
    parser.add_argument(
        "sweep", nargs="?", default="latest", metavar="SWEEP_ID", help="a sweep id, 'latest', or a sweep's folder"
    )
    store_arguments(parser)
    parser.add_argument("--report", action="store_true", help="also build the report of what has finished so far")
    args = parser.parse_args(argv)
    client, experiment_id = open_experiment(args)
    (parent,) = find_parents(client, experiment_id, [args.sweep])
    rows = status_rows(client, parent)
    table = Table(
        title=f"sweep {parent.data.tags.get(metrics.TAG_SWEEP_ID)}: {parent.info.run_name} ({parent.info.status})"
    )
    for col in ("point", "state", ""):
        table.add_column(col, overflow="fold")
    for point, state, detail in rows:
        colour = COLOURS.get(state, "red")
        table.add_row(point, f"[{colour}]{state}[/{colour}]", detail)
    console.print(table)
    counts = Counter(state for _p, state, _d in rows)
    console.print("  ".join(f"{s} {n}" for s, n in counts.items()) + f"  of {len(rows)}")
    if args.report:
        from sweeper.report import report_for

        folder = default_folder([parent]).parent / "report-so-far"
        report = report_for(client, [parent], folder, attach=False)
        console.print(f"report so far ({len(report.rows)} point(s)): {(folder / 'report.html').resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
