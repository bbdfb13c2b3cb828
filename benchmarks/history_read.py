"""A report's read of a long run's loss: whole (MLflow's get_metric_history) against sampled
(sweeper/report/study.py series, SAMPLED values). The run's 10^6 loss steps are written straight
into a fresh SQLite store (through MLflow's API they would take minutes).

    python benchmarks/history_read.py [STEPS]
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time

from sweeper.report.study import series
from trainer import metrics
from trainer.record import store


def main(steps: int) -> None:
    folder = tempfile.mkdtemp()
    uri = f"sqlite:///{folder}/mlflow.db"
    client = store.client(uri)
    run = client.create_run(store.ensure_experiment(client, uri, "history")).info.run_id
    client.log_metric(run, metrics.TEST_PRECISION, 0.9)  # the schema in place
    rows = ((metrics.TRAIN_LOSS, 1.0 / (1 + s), 1_700_000_000_000 + s, run, s, 0) for s in range(steps))
    with sqlite3.connect(f"{folder}/mlflow.db") as db:
        db.executemany("INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?,?,?,?,?,?)", rows)
    t = time.perf_counter()
    n = len(series(client, run, metrics.TRAIN_LOSS))
    print(f"sampled: {n} values in {time.perf_counter() - t:.2f} s")
    t = time.perf_counter()
    n = len(client.get_metric_history(run, metrics.TRAIN_LOSS))
    print(f"whole:   {n} values in {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
