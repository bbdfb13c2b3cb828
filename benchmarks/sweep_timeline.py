"""Where a sweep's time goes: the sweeper's own phases, then one line per run.

    python benchmarks/sweep_timeline.py multirun/DATE/TIME [sqlite:///path/to/mlflow.db]

The phases come from the sweep folder's timeline.json (sweeper/timeline.py), in seconds from the
sweeper process's start: Python and Hydra come before the first. Each run (with the store): its
worker, start and end from the process's start, time to first batch, training (the sum of its
epoch times), the steps its CPU check compared, whether the reference was cached, its weight error,
the largest share of its timed batches a rank waited for a core.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def phases(folder: Path) -> float:
    doc = json.loads((folder / "timeline.json").read_text())
    rows = doc["phases"]
    print(f"{'python, imports, hydra':34s} {0:7.2f} {rows[0]['start_s']:7.2f} {rows[0]['start_s']:7.2f} s")
    for r in rows:
        print(f"{r['phase']:34s} {r['start_s']:7.2f} {r['end_s']:7.2f} {r['end_s'] - r['start_s']:7.2f} s")
    print(f"{'(timeline written)':34s} {doc['written_s']:7.2f}")
    return doc["process_start"]


def runs(uri: str, t0: float) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("sweepscale")
    found = client.search_runs([exp.experiment_id], max_results=1000, order_by=["attributes.start_time DESC"])
    parent = next(r for r in found if "mlflow.parentRunId" not in r.data.tags)
    kids = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    for r in sorted(kids, key=lambda r: r.info.start_time):
        m, tags = r.data.metrics, r.data.tags
        training = sum(x.value for x in client.get_metric_history(r.info.run_id, "time/epoch_s"))
        errors = client.get_metric_history(r.info.run_id, "check/weight_rel_error/max")
        landed = f"{errors[0].timestamp / 1e3 - t0:6.2f}" if errors else "     -"
        print(
            f"{r.info.run_name:22s} {tags.get('sweepscale.worker', '-'):26s} "
            f"start {r.info.start_time / 1e3 - t0:6.2f} end {r.info.end_time / 1e3 - t0:6.2f} check {landed} "
            f"first_batch {m.get('time/to_first_batch_s', float('nan')):5.2f} training {training:6.3f} "
            f"steps {tags.get('sweepscale.check_steps', '-'):>4s} reference {tags.get('sweepscale.reference', '-')} "
            f"error {m.get('check/weight_rel_error/max', float('nan')):.1e} "
            f"core_wait {m.get('timing/core_wait', float('nan')):.0%}"
        )


if __name__ == "__main__":
    t0 = phases(Path(sys.argv[1]))
    if len(sys.argv) > 2:
        runs(sys.argv[2], t0)
