"""A run a sweep steers while it trains (a search's trial, sweeper/search/study.py): each epoch's values
appended to ``progress.jsonl`` in ``save.progress_dir``, and a ``stop`` file there, written by the
sweeper, ends the run after the epoch it lands in: its run ends KILLED, tagged with why (a
pruned trial), and its ranks go on to the next point. Standard library only: the sweeper reads and
writes the same files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PROGRESS = "progress.jsonl"
STOP = "stop"


class StopRequested(BaseException):
    """The sweep asked the run to stop after this epoch (every rank raises it together)."""

    def __init__(self, epoch: int, epochs: int, why: str) -> None:
        super().__init__(f"stopped after epoch {epoch} of {epochs} at the sweep's request: {why}")
        self.epoch, self.epochs, self.why = epoch, epochs, why


def append(folder: str | Path, epoch: int, values: dict[str, Any]) -> None:
    """One epoch's line, e.g. {"epoch": 3, "test/precision": 0.91, ...} (written whole: one write)."""
    line = json.dumps({"epoch": epoch, **values}) + "\n"
    with open(Path(folder) / PROGRESS, "a") as f:
        f.write(line)


def read(folder: str | Path, seen: int = 0) -> list[dict[str, Any]]:
    """The epochs' lines after the first ``seen`` (a line still being written is left for later)."""
    try:
        text = (Path(folder) / PROGRESS).read_text()
    except OSError:
        return []
    lines = text.splitlines(keepends=True)
    return [json.loads(line) for line in lines[seen:] if line.endswith("\n")]


def ask_stop(folder: str | Path, why: str) -> None:
    """The sweeper's request: the run stops after its current epoch. Written aside, then renamed: a
    run reading it between the file's creation and its write read no reason (its pruned tag lost)."""
    aside = Path(folder) / f"{STOP}.tmp"
    aside.write_text(why)
    os.replace(aside, Path(folder) / STOP)


def stop_asked(folder: str | Path) -> str | None:
    """Why the sweep asked the run to stop, or None."""
    try:
        return (Path(folder) / STOP).read_text() or "asked"
    except OSError:
        return None
