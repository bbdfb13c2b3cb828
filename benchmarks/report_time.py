"""What the study report adds to a sweep: seconds to build it from the store, by sweep size.

Runs one real sweep of N tiny points (in-process, ``launcher=debug``) into a temporary SQLite
store, then rebuilds its report ``--repeats`` times and prints the median time of each stage.

    .venv/bin/python benchmarks/report_time.py --points 4 32
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


def run_sweep(folder: Path, n: int) -> None:
    args = [f"hidden=range(8,{8 + 8 * n},8)", "epochs=2", "data.n_train=500", "batch_size=100", "launcher=debug"]
    cmd = [sys.executable, "-m", "sweeper", "-m", *args, f"hydra.sweep.dir={folder / 'sweep'}"]
    subprocess.run(cmd, cwd=folder, check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, nargs="+", default=[4, 32])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from sweeper.report import publish, study
    from sweeper.report.__main__ import find_parents
    from trainer.record import store

    print(f"{'points':>6} {'load s':>7} {'build s':>8} {'attach s':>9} {'total s':>8}")
    for n in args.points:
        with tempfile.TemporaryDirectory() as d:
            folder = Path(d)
            uri = f"sqlite:///{folder / 'mlflow.db'}"
            os.environ.update(MLFLOW_TRACKING_URI=uri, SWEEPSCALE_CACHE=str(folder / "cache"))
            run_sweep(folder, n)
            client = store.client(uri)
            exp = client.get_experiment_by_name("sweepscale")
            parents = find_parents(client, exp.experiment_id, ["latest"])
            stages: dict[str, list[float]] = {"load": [], "build": [], "attach": []}
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                s = study.load(client, parents)
                t1 = time.perf_counter()
                report = publish.build(s, folder / "report")
                t2 = time.perf_counter()
                publish.publish(client, parents[0].info.run_id, report, s.points)
                t3 = time.perf_counter()
                for key, value in zip(stages, (t1 - t0, t2 - t1, t3 - t2)):
                    stages[key].append(value)
            med = {k: statistics.median(v) for k, v in stages.items()}
            print(f"{n:>6} {med['load']:>7.2f} {med['build']:>8.2f} {med['attach']:>9.2f} {sum(med.values()):>8.2f}")


if __name__ == "__main__":
    main()
