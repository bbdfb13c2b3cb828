"""The sweep's own account of itself in its folder, ``sweep.json``: its id, its parent run's name and
state, its points, and whether each of its runs keeps a journal there (trainer/record/journal.py).
``python -m sweeper.status`` answers from it and the journals without importing MLflow (seconds of
CPU on a busy machine); SweepRecord (records.py) writes it wherever it changes the parent.
Imports nothing of MLflow."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from trainer import metrics
from trainer.record import journal

FILE = "sweep.json"
TAIL_BYTES = 16384  # a journal's end that holds its last epoch's line (an epoch's metrics: a line of ~1 KB)
SWEEPS_GLOB = "multirun/*/*/" + FILE  # Hydra's default sweep folders (hydra.sweep.dir), from the working directory


def write(folder: Path, **fields: Any) -> None:
    """Merge ``fields`` into the folder's sweep.json, atomically (a reader never sees half of it)."""
    path = folder / FILE
    state = read(folder) or {}
    state.update(fields)
    tmp = path.with_name(f".{FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def keep(folder: Path, **fields: Any) -> None:
    """``write``, where failing fails nothing: on a full disk the store has it, and status asks the store."""
    with contextlib.suppress(OSError):
        write(folder, **fields)


def read(folder: Path) -> dict[str, Any] | None:
    """The folder's sweep.json, or None where there is none (an older sweep, or not a sweep)."""
    try:
        return json.loads((folder / FILE).read_text())
    except (OSError, ValueError):
        return None


def find(wanted: str, cwd: Path) -> Path | None:
    """The folder of sweep ``wanted`` (a folder, a sweep id or ``latest``: the newest under
    ``cwd/multirun``) whose sweep.json says every run keeps a journal; None: ask the store."""
    if "/" in wanted or (cwd / wanted).is_dir():
        folder = (cwd / wanted).resolve()
        return folder if (read(folder) or {}).get("journals") else None
    sweeps = sorted(cwd.glob(SWEEPS_GLOB), reverse=True)  # DATE/TIME names: the newest first
    for path in sweeps:
        state = read(path.parent) or {}
        if wanted in ("latest", state.get("sweep_id")):
            return path.parent if state.get("journals") else None
    return None


def runs(folder: Path) -> dict[str, dict[str, Any]]:
    """Each journaled run of the sweep by its name: its status (RUNNING until its end is written),
    params, last value of each metric, epoch times (step, seconds) and tags, from its journal."""
    found: dict[str, dict[str, Any]] = {}
    for point in sorted(p for p in folder.iterdir() if p.is_dir()):
        entries = [entry for name in (journal.DONE, journal.FILE) for entry in lines(point / name)]
        if not entries or "name" not in entries[0]:
            continue
        run: dict[str, Any] = {"status": "RUNNING", "params": {}, "metrics": {}, "epoch_s": [], "tags": {}}
        for entry in entries:
            op = entry["op"]
            if op in ("params", "tags"):
                run[op].update(entry[op])
            elif op == "metrics":
                for key, value, _ms, step in entry["metrics"]:
                    run["metrics"][key] = value
                    if key == metrics.EPOCH_TIME:
                        run["epoch_s"].append((step, value))
            elif op == "end":
                run["status"] = entry["status"]
        found[entries[0]["name"]] = run
    return found


def epoch_done(folder: Path) -> int | None:
    """The last epoch a point's journal has recorded, read from its tail (the progress line asks at
    every poll: a journal of 10^6 steps is not read whole); None where it has none yet."""
    for name in (journal.FILE, journal.DONE):
        try:
            with open(folder / name, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
                tail = f.read().decode(errors="replace")
        except OSError:
            continue
        for line in reversed(tail.splitlines()[1:] or tail.splitlines()):  # the first may be cut
            if metrics.EPOCH_TIME in line and line.endswith("}"):
                entry = json.loads(line)
                return max(step for key, _v, _ms, step in entry.get("metrics", []) if key == metrics.EPOCH_TIME)
    return None


def lines(path: Path) -> list[dict[str, Any]]:
    """A journal's entries; none where it is missing, and not a last line still being written."""
    try:
        text = path.read_text()
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]  # not a line being written
