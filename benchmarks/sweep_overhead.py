"""What a sweep costs beyond its runs: per-point overhead, warm workers against a process per point.

    python benchmarks/sweep_overhead.py                       # 32 tiny points, local, warm and cold
    python benchmarks/sweep_overhead.py --launchers slurm     # the same on the real Slurm
    python benchmarks/sweep_overhead.py --grid headline --data .device/mnist   # the GPU sweep
    python benchmarks/sweep_overhead.py --grid headline --data .device/mnist --modes warm warm --cache /tmp/c

Figures, from MLflow and the clock around the command:
- command: the wall time of ``python -m sweeper ...`` (Hydra, planning, the runs, the report);
- sweep: the parent run's span (from its creation to its end, before the report);
- start: parent start to the first child run's start (the first worker's, or job's, start-up);
- busy: the time at least one child run was open (the union of their spans), and its share of
  the command;
- training: the sum of the runs' epoch times;
- overhead/point: (sweep - start - busy) / points, issue #19's measure (with points one at a
  time, busy is the sum of in-run times).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

GRIDS = {
    "tiny": ["hidden=range(8,264,8)", "epochs=1", "data.n_train=500"],
    "headline": ["hidden=512,1024,2048", "nproc=1,2", "epochs=3"],
    "headline-1gpu": ["hidden=512,1024,2048", "nproc=1", "epochs=3"],  # when one GPU is all there is
}
LAUNCHERS = {  # points one at a time where the launcher allows: the overhead is not hidden by overlap
    "local": ["launcher=local", "launcher.cpus=1"],
    "local-all": ["launcher=local"],  # as many at once as there are GPUs (or cores)
    "slurm": ["launcher=slurm", "launcher.array_parallelism=1", "launcher.points_per_job=32"],
}


def union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def measure(grid: str, launcher: str, warm: bool, extra: list[str], cache: str | None) -> dict[str, float]:
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as d:
        uri = f"sqlite:///{d}/mlflow.db"
        MlflowClient(uri).search_experiments()  # the store's tables first: not a sweep's cost
        cmd = [sys.executable, "-m", "sweeper", "-m", *GRIDS[grid], *LAUNCHERS[launcher], *extra]
        cmd += [f"launcher.warm={str(warm).lower()}", f"mlflow.tracking_uri={uri}"]
        env = {
            **os.environ,
            "SWEEPSCALE_CACHE": cache or f"{d}/cache",
        }  # the CPU references: from scratch unless --cache
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=d, capture_output=True, text=True, env=env)
        if done.returncode:
            sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        command = time.perf_counter() - t0
        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("sweepscale").experiment_id], max_results=1000)
        (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        kids = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
        assert kids and all(r.info.status == "FINISHED" for r in kids)
        training = sum(m.value for r in kids for m in client.get_metric_history(r.info.run_id, "time/epoch_s"))
    spans = [(r.info.start_time / 1e3, r.info.end_time / 1e3) for r in kids]
    sweep = (parent.info.end_time - parent.info.start_time) / 1e3
    start = min(a for a, _ in spans) - parent.info.start_time / 1e3
    busy = union(spans)
    first = [r.data.metrics["time/to_first_batch_s"] for r in kids if "time/to_first_batch_s" in r.data.metrics]
    return {
        "points": len(kids),
        "command": command,
        "sweep": sweep,
        "start": start,
        "busy": busy,
        "in_runs": sum(b - a for a, b in spans),
        "training": training,
        "first_batch": statistics.median(first) if first else float("nan"),
        "per_point": (sweep - start - busy) / len(kids),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", choices=GRIDS, default="tiny")
    parser.add_argument("--launchers", nargs="+", choices=LAUNCHERS, default=["local"])
    parser.add_argument("--modes", nargs="+", choices=["warm", "cold"], default=["warm", "cold"])
    parser.add_argument("--data", help="data.dir for every point (default: the config's)")
    parser.add_argument(
        "--cache",
        help="a CPU reference cache kept across the runs (a repeated sweep: "
        "`--modes warm warm` measures fresh, then cached); default: fresh for each run",
    )
    parser.add_argument("extra", nargs="*", help="more overrides for every point")
    args = parser.parse_args()
    extra = [*args.extra, *([f"data.dir={os.path.abspath(args.data)}"] if args.data else [])]
    table = Table(title=f"sweep overhead, grid {args.grid}: {' '.join(GRIDS[args.grid] + extra)} (seconds)")
    cols = ("launcher", "mode", "points", "command", "sweep", "start", "busy (share)", "training", "first batch")
    for col in (*cols, "overhead/point"):
        table.add_column(col, justify="right")
    for launcher in args.launchers:
        for mode in args.modes:
            m = measure(args.grid, launcher, mode == "warm", extra, args.cache)
            share = m["busy"] / m["command"]
            table.add_row(
                launcher,
                mode,
                str(m["points"]),
                f"{m['command']:.1f}",
                f"{m['sweep']:.1f}",
                f"{m['start']:.2f}",
                f"{m['busy']:.1f} ({share:.0%})",
                f"{m['training']:.2f}",
                f"{m['first_batch']:.3f}",
                f"{m['per_point'] * 1e3:.0f} ms",
            )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
