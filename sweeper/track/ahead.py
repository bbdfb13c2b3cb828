"""A grid's points started before its store is open, where the store cannot change which of them
run: a new SQLite store (nothing FINISHED to skip, no checkpoint to resume, no earlier sweep's
job going on) whose runs this sweeper creates itself from its warm workers' journals
(sweeper/track/handoff.py). Their tickets go out as soon as the points are planned, then MLflow imports
(2-3 s on a GPU node, what the workers' own start takes; begun before the tickets, in one GIL, it
slowed them); each point's config then names no parent run. Once MLflow is in and the parent
created, each point's folder is told its id (trainer/record/journal.py), and the run's first sender
tags the run with it. Anywhere else the store decides first, then the tickets go (sweep.py's
open_sweep)."""

from __future__ import annotations

import os
from pathlib import Path

from sweeper.plan.point_files import prepare
from sweeper.points import Point
from sweeper.runners.base import Runner
from sweeper.track.watch import Flight, step
from trainer.record import journal, store


def possible(runner: Runner, points: list[Point], uri: str) -> bool:
    """Whether these points may start before the store is open: a new SQLite store, runs handed off."""
    db = store.sqlite_file(uri)
    return db is not None and not db.exists() and runner.hands_off(points)


def start(runner: Runner, points: list[Point], uri: str, experiment: str, sweep_id: str) -> Flight:
    """The points' configs written and their tickets out (where :func:`possible`)."""
    for p in points:
        prepare(p, uri, experiment, None, sweep_id, checkpoints=False)
    flight = Flight(list(points))
    step(runner, flight)  # the tickets: warm workers take them as soon as they are ready
    return flight


def tell_parent(flight: Flight, parent_id: str) -> None:
    """The sweep's parent run, now created, told to every point started ahead."""
    for p in [*flight.queued, *flight.started.values()]:
        write_parent(p.dir, parent_id)


def write_parent(folder: Path, parent_id: str) -> None:
    """The parent run of the run journaled (or still to be) in ``folder``: its first sender tags it so."""
    tmp = folder / f".{journal.PARENT}.tmp"
    tmp.write_text(parent_id)
    os.replace(tmp, folder / journal.PARENT)
