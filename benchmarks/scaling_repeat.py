"""Two runs of the same sweep side by side, from their report's points.csv: each point's ms per
batch (and interval) in both, the difference, and each scaling family's speedup in both. Issue 46's
target: every ms per batch and every speedup within 5% between the two.

    python benchmarks/scaling_repeat.py first/points.csv second/points.csv
"""

from __future__ import annotations

import csv
import sys


def rows(path: str) -> dict[str, dict[str, str]]:
    with open(path) as f:
        return {r["point"]: r for r in csv.DictReader(f)}


def main(a_path: str, b_path: str) -> None:
    a, b = rows(a_path), rows(b_path)
    worst_ms = worst_speedup = 0.0
    print(f"{'point':34s} {'ms a batch, 1st':>22s} {'2nd':>22s} {'diff':>7s}   speedup 1st / 2nd")
    for name in a:
        if name not in b or not a[name]["batch_ms"]:
            continue
        x, y = a[name], b[name]
        t1, t2 = float(x["batch_ms"]), float(y["batch_ms"])
        diff = t2 / t1 - 1
        worst_ms = max(worst_ms, abs(diff))
        speedups = []
        for kind in ("strong", "weak"):
            if x.get(f"{kind}_speedup") and y.get(f"{kind}_speedup"):
                s1, s2 = float(x[f"{kind}_speedup"]), float(y[f"{kind}_speedup"])
                if int(x["nproc"]) > 1:
                    worst_speedup = max(worst_speedup, abs(s2 / s1 - 1))
                speedups.append(f"{kind} {s1:.2f}x / {s2:.2f}x")
        spans = [f"{float(r['batch_ms']):.4f} ({float(r['batch_ms_lo']):.4f}-{float(r['batch_ms_hi']):.4f})"
                 for r in (x, y)]  # fmt: skip
        print(f"{name:34s} {spans[0]:>22s} {spans[1]:>22s} {diff:+7.1%}   {'; '.join(speedups)}")
    print(f"largest difference: ms a batch {worst_ms:.1%}, speedup {worst_speedup:.1%}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
