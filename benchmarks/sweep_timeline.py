"""One line per run of the newest sweep in a store: where a warm sweep's time goes.

    python benchmarks/sweep_timeline.py sqlite:///path/to/mlflow.db

Each run: its worker, start and end from the parent's start, time to first batch, training (the
sum of its epoch times), whether its CPU reference was cached, and its weight error.
"""

from __future__ import annotations

import sys

from mlflow.tracking import MlflowClient


def main(uri: str) -> None:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("sweepscale")
    runs = client.search_runs([exp.experiment_id], max_results=1000, order_by=["attributes.start_time DESC"])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    t0 = parent.info.start_time / 1e3
    print(f"parent {parent.info.run_name}: {parent.info.end_time / 1e3 - t0:.2f} s")
    for r in sorted(kids, key=lambda r: r.info.start_time):
        m, tags = r.data.metrics, r.data.tags
        training = sum(x.value for x in client.get_metric_history(r.info.run_id, "time/epoch_s"))
        print(
            f"{r.info.run_name:22s} {tags.get('sweepscale.worker', '-'):28s} "
            f"start {r.info.start_time / 1e3 - t0:6.2f} end {r.info.end_time / 1e3 - t0:6.2f} "
            f"first_batch {m.get('time/to_first_batch_s', float('nan')):6.2f} training {training:6.3f} "
            f"reference {tags.get('sweepscale.reference', '-')} "
            f"error {m.get('check/weight_rel_error/max', float('nan')):.1e}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
