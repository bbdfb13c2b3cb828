"""How long a sweep takes to end on a full disk: tests/test_disk_full.py's first sweep, timed N times.

    sudo .venv/bin/python benchmarks/disk_full.py --runs 8      # root: it mounts a small tmpfs

Each run mounts a fresh 1460 KiB tmpfs (the test's), creates the empty store there and runs the
test's 2-point sweep on it, which fills the disk while it records. Which write fails first varies
from run to run, so the wall times are printed one by one, then min/median/max.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRID = ["hidden=16,32", "epochs=2", "batch_size=50", "data.n_train=200", "data.n_test=50"]
QUIET = ["perf.min_batches=1", "perf.min_seconds=0", "report.figures=false", "sweep.retime=false"]


def one_run(folder: Path) -> tuple[float, int, str]:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1460k", "tmpfs", str(folder)], check=True)
    try:
        uri = f"sqlite:///{folder / 'mlflow.db'}"
        env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "SWEEPSCALE_CACHE")}
        env["OPENBLAS_NUM_THREADS"] = "1"
        make_store = f"from mlflow.tracking import MlflowClient; MlflowClient({uri!r}).search_experiments()"
        subprocess.run([sys.executable, "-c", make_store], env=env, check=True, capture_output=True, timeout=120)
        cmd = [sys.executable, "-m", "sweeper", "-m", *GRID, *QUIET, f"mlflow.tracking_uri={uri}"]
        begun = time.monotonic()
        done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - begun
        said = next((line for line in done.stdout.splitlines()[::-1] if line.startswith("[sweep")), "")
        return wall, done.returncode, said
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root to mount a small tmpfs")
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            folder = Path(tmp) / str(i)
            folder.mkdir()
            wall, rc, said = one_run(folder)
            walls.append(wall)
            print(f"run {i + 1}: {wall:5.1f} s, exit {rc}: {said}", flush=True)
    print(f"{args.runs} runs: min {min(walls):.1f} s, median {statistics.median(walls):.1f} s, max {max(walls):.1f} s")


if __name__ == "__main__":
    main()
