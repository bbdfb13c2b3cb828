"""Per-point overhead of a 9-point sweep: sweep wall time minus time spent in the runs, per point.

Points run one at a time (launcher.cpus=1 locally, array_parallelism=1 on Slurm), so the wall
time is the runs plus everything around them (with "local-2", two at a time: runs count half):
Hydra, planning, job submission and start-up,
the trainer's process start and imports, MPI start, collection. "In runs" is the span MLflow
recorded for each child run (start to end, inside the trainer); "training" is its epoch time.

    python benchmarks/sweep_overhead.py [--launchers local slurm]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

GRID = ["hidden=16,32,64", "lr=0.05,0.1,0.2", "epochs=1", "nproc=1", "check.reference=false"]
SETTINGS = {
    "local": ["launcher=local", "launcher.cpus=1"],
    "slurm": ["launcher=slurm", "launcher.array_parallelism=1"],
    "local-2": ["launcher=local", "launcher.cpus=2"],  # two points at a time on two cores
}


def measure(launcher: str) -> dict[str, float]:
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as d:
        uri = f"sqlite:///{d}/mlflow.db"
        env_cmd = [sys.executable, "-m", "sweeper", "-m", *GRID, *SETTINGS[launcher], f"mlflow.tracking_uri={uri}"]
        t0 = time.perf_counter()
        subprocess.run(env_cmd, cwd=d, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("sweepscale")
        kids = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
        assert len(kids) == 9 and all(r.info.status == "FINISHED" for r in kids)
        in_runs = sum((r.info.end_time - r.info.start_time) / 1e3 for r in kids)
        training = sum(r.data.metrics["time/epoch_s"] for r in kids)
    parallel = 2 if launcher.endswith("-2") else 1
    return {"wall": wall, "in_runs": in_runs, "training": training, "per_point": (wall - in_runs / parallel) / 9}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launchers", nargs="+", default=["local", "slurm", "local-2"])
    args = parser.parse_args()
    table = Table(title="9-point sweep, points one at a time (seconds)")
    for col in ("launcher", "sweep wall", "in runs (MLflow span)", "training (epochs)", "overhead per point"):
        table.add_column(col, justify="right")
    for launcher in args.launchers:
        m = measure(launcher)
        table.add_row(
            launcher, f"{m['wall']:.1f}", f"{m['in_runs']:.1f}", f"{m['training']:.2f}", f"{m['per_point']:.2f}"
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
