"""Which tests the suite's CPU goes to: a pytest plugin that records each test's CPU, and a table of it.

    PYTHONPATH=$PWD/benchmarks PYTEST_ADDOPTS="-p cpu_by_test" CPU_BY_TEST=/tmp/cpu.jsonl make test
    python benchmarks/cpu_by_test.py /tmp/cpu.jsonl          # by test file, then the costliest tests

A test's CPU is its xdist worker's own plus that of the processes it started and reaped (getrusage's
RUSAGE_CHILDREN counts a descendant once its parent waited for it): sweeps, their workers and ranks.
What Slurm, a tracking server or PostgreSQL spend for it is not in it (benchmarks/cpu_by_process.py
sees the whole machine). Each worker appends a line a test, so the file gathers every worker's.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

OUT_ENV = "CPU_BY_TEST"


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    (own0, kids0), start = _cpu(), time.time()
    yield  # setup, call and teardown: a module fixture's sweep counts in the test that first needs it
    own1, kids1 = _cpu()
    row = {"id": item.nodeid, "start": start, "wall": time.time() - start, "own": own1 - own0,
           "children": kids1 - kids0, "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}  # fmt: skip
    with open(os.environ.get(OUT_ENV, "cpu_by_test.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def table(rows: list[dict[str, Any]], top: int = 15) -> str:
    """CPU and wall by test file, then the ``top`` tests by CPU."""
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        acc = by_file[r["id"].split("::")[0]]
        acc[0], acc[1], acc[2] = acc[0] + r["own"] + r["children"], acc[1] + r["wall"], acc[2] + 1
    cpu = sum(r["own"] + r["children"] for r in rows)
    lines = [f"{len(rows)} tests: {cpu:.0f} CPU s (their workers' {sum(r['own'] for r in rows):.0f}), "
             f"{sum(r['wall'] for r in rows):.0f} s of tests' wall", "", "  CPU s   wall s  tests  file"]  # fmt: skip
    for name, (c, w, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{c:7.0f}  {w:7.0f}  {n:5d}  {name}")
    lines += ["", f"  CPU s   wall s  the {top} costliest tests"]
    for r in sorted(rows, key=lambda r: -(r["own"] + r["children"]))[:top]:
        lines.append(f"{r['own'] + r['children']:7.1f}  {r['wall']:7.1f}  {r['id']}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        print(table([json.loads(line) for line in f if line.strip()]))
