"""Cold start of a single point: ``python -m trainer`` in a process of its own, N times.

Each run's time to first batch (``time/to_first_batch_s``: from the process's start to its first
batch, as the trainer logs it) and its whole wall time (process start to exit, timed here). The
SQLite store is prepared first (MLflow's migrations, the experiment), as a sweep's is before its
points run, so a run pays only for opening it.

    python benchmarks/cold_start.py [--n 5] [overrides ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

POINT = ["epochs=1", "data.n_train=500", "hidden=8"]


def prepare_store(uri: str) -> None:
    """Create the database and the experiment, as the first run (or the sweeper) would."""
    from trainer.record import store

    store.ensure_experiment(store.client(uri), uri, store.DEFAULT_EXPERIMENT)


def measure(n: int, overrides: list[str]) -> tuple[list[float], list[float]]:
    """(time to first batch, wall) in seconds, one pair per run."""
    from mlflow.tracking import MlflowClient

    walls: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        uri = f"sqlite:///{d}/mlflow.db"
        prepare_store(uri)
        cmd = [sys.executable, "-m", "trainer", *overrides, f"mlflow.tracking_uri={uri}"]
        for _ in range(n):
            t0 = time.perf_counter()
            done = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
            walls.append(time.perf_counter() - t0)
            if done.returncode:
                sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("sweepscale")
        runs = client.search_runs([exp.experiment_id], order_by=["start_time ASC"])
        assert len(runs) == n and all(r.info.status == "FINISHED" for r in runs)
        first = [r.data.metrics["time/to_first_batch_s"] for r in runs]
    return first, walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5, help="runs (default 5)")
    parser.add_argument("overrides", nargs="*", default=POINT, help=f"the point (default: {' '.join(POINT)})")
    args = parser.parse_args()
    first, walls = measure(args.n, args.overrides)
    table = Table(title=f"cold start, {args.n} x python -m trainer {' '.join(args.overrides)} (seconds)")
    for col in ("", "median", "min", "max"):
        table.add_column(col, justify="right")
    for name, values in (("to first batch", first), ("wall (process)", walls)):
        table.add_row(name, *(f"{f(values):.2f}" for f in (statistics.median, min, max)))
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
