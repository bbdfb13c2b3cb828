"""Where a sweep's own seconds go: each phase's start and end from the process's start (Python and
Hydra before the first phase), written to the sweep folder as ``timeline.json`` and read by
``benchmarks/sweep_timeline.py``. Phases may overlap (the report drawn while checks land)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainer.core.clock import process_start

FILE = "timeline.json"
_phases: list[tuple[str, float, float]] = []


@contextmanager
def phase(name: str) -> Iterator[None]:
    start = time.time()
    try:
        yield
    finally:
        _phases.append((name, start, time.time()))


def since_start() -> list[tuple[str, float, float]]:
    """(phase, start, end) in seconds from the process's start, in the order they began."""
    t0 = process_start()
    return [(name, a - t0, b - t0) for name, a, b in sorted(_phases, key=lambda p: p[1])]


def write(folder: Path) -> None:
    """The phases so far, and the process's age now, as ``timeline.json`` in ``folder``."""
    rows = [{"phase": n, "start_s": round(a, 3), "end_s": round(b, 3)} for n, a, b in since_start()]
    doc = {"process_start": process_start(), "written_s": round(time.time() - process_start(), 3), "phases": rows}
    (folder / FILE).write_text(json.dumps(doc, indent=1))
