"""An asynchronous search against Hydra's Optuna sweeper, on the same trials' budget (issue #35).

    python benchmarks/search_vs_batches.py [--trials 24] [--hydra-optuna SITE]

A: ``python -m sweeper -m hydra/sweeper=search ...`` (sweeper/search/study.py: a trial asked each time a
slot frees, one set of warm workers for the whole search). B: Hydra's own Optuna sweeper
(hydra-optuna-sweeper, which pins optuna<3: installed apart, in SITE, put first on PYTHONPATH)
with ``n_jobs=2``, launching each batch of two trials through sweepscale's launcher, so that each
batch is a sweep of its own and waits for its slower trial. The same space (lr on a log scale x
nproc=1,2), trial count and tiny points on the CPU, each in a fresh folder and store.

For each: the command's wall time, its workers (a warm worker is a submitit job: its life from its
log's first to last line), the seconds its runs were open (MLflow's start to end time, summed) and
trained (their epochs), and the share of the workers' lives they spent idle, with no run open.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

POINTS = ["device=cpu", "data.n_train=400", "data.n_test=100", "epochs=10", "launcher.cpus=2"]
SPACE = ["lr=tag(log,interval(0.01,1))", "nproc=1,2"]
STAMP = re.compile(r"submitit \w+ \((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\)")


def run(label: str, args: list[str], pythonpath: str | None) -> tuple[float, Path]:
    folder = Path(tempfile.mkdtemp(prefix=f"search-{label}-"))
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{folder / 'mlflow.db'}", SWEEPSCALE_CACHE=str(folder / "c"))
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")])
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sweeper", "-m", *args], cwd=folder, env=env, capture_output=True)
    wall = time.monotonic() - t0
    if done.returncode:
        sys.exit(f"{label} failed ({done.returncode}):\n{done.stdout.decode()[-3000:]}\n{done.stderr.decode()[-3000:]}")
    return wall, folder


def workers(folder: Path) -> dict[str, float]:
    """pid -> seconds alive, of every warm worker (a submitit job: its log's first and last stamp)."""
    out = {}
    for log in folder.glob("multirun/*/*/.submitit/*/*_log.out"):
        stamps = [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f") for m in STAMP.finditer(log.read_text())]
        if len(stamps) >= 2:
            out[log.parent.name] = (stamps[-1] - stamps[0]).total_seconds()
    return out


def busy(folder: Path) -> tuple[int, float, float, float]:
    """Trials run, seconds of runs open (start to end, summed), of training (their epochs), and the
    best test precision."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweepscale")
    kids = [r for r in client.search_runs([exp.experiment_id], max_results=5000) if "mlflow.parentRunId" in r.data.tags]
    seconds = sum((r.info.end_time - r.info.start_time) / 1e3 for r in kids)
    training = sum(m.value for r in kids for m in client.get_metric_history(r.info.run_id, "time/epoch_s"))
    best = max(r.data.metrics.get("test/precision", 0.0) for r in kids)
    return len(kids), seconds, training, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--hydra-optuna", default="/tmp/hos/site", help="holds hydra-optuna-sweeper and optuna<3")
    ap.add_argument(
        "--runs",
        nargs="+",
        default=["search", "optuna"],
        choices=["search", "optuna", "slurm"],
        help="slurm: the search through scripts/slurm_up.sh's Slurm, two allocations at once",
    )
    a = ap.parse_args()
    search = [*SPACE, "hydra/sweeper=search", f"hydra.sweeper.n_trials={a.trials}"]
    on_slurm = [p for p in POINTS if not p.startswith("launcher.")] + ["launcher=slurm", "launcher.array_parallelism=2"]
    commands = {
        "search": ("A search", [*search, *POINTS], None),
        "optuna": (
            "B Hydra's Optuna, n_jobs=2",
            [*SPACE, *POINTS, "hydra/sweeper=optuna", f"hydra.sweeper.n_trials={a.trials}", "hydra.sweeper.n_jobs=2"],
            a.hydra_optuna,
        ),
        "slurm": ("C search on Slurm", [*search, *on_slurm], None),
    }
    print(f"{'command':28s} {'wall s':>7s} {'trials':>6s} {'workers':>7s} {'alive s':>8s} {'in runs s':>9s} "
          f"{'training s':>10s} {'idle':>5s} {'best':>6s}")  # fmt: skip
    for label, args, site in (commands[k] for k in a.runs):
        wall, folder = run(label.split()[0], args, site)
        lives = workers(folder)
        trials, in_runs, training, best = busy(folder)
        alive = sum(lives.values())
        idle = 1 - in_runs / alive if alive else float("nan")
        print(
            f"{label:28s} {wall:7.1f} {trials:6d} {len(lives):7d} {alive:8.1f} {in_runs:9.1f} {training:10.2f} "
            f"{idle:5.0%} {best:6.3f}"
        )


if __name__ == "__main__":
    main()
