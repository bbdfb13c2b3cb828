"""Watching a sweep's jobs: start what fits, count states, release what ended; on Ctrl-C or
SIGTERM, cancel the jobs and give their trainers time to end their runs KILLED."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sweeper import display
from sweeper.plan.point_files import link_logs
from sweeper.points import Point
from sweeper.track import sweep_file

if TYPE_CHECKING:
    from sweeper.runners.base import Job, Runner

CANCEL_GRACE_S = 30  # how long cancelled trainers get to end their runs KILLED themselves


@dataclass
class Flight:
    """Where each point to run stands; what the watch leaves for the collect step."""

    queued: list[Point]
    running: dict[int, tuple[Point, Job]] = field(default_factory=dict)
    finished: dict[int, BaseException | None] = field(default_factory=dict)  # index -> the job's error
    logs: dict[int, str] = field(default_factory=dict)  # index -> the job's stderr, linked in its folder
    interrupted: bool = False
    earlier: set[int] = field(default_factory=set)  # points an earlier sweep's job trains: not the runner's
    started: dict[int, Point] = field(default_factory=dict)  # every point started, by index (also those ended)
    # When its points began: points started ahead of the store (ahead.py) may have ended before the
    # watch, and a progress line timed from the watch would promise "about 0 s left".
    t0: float = field(default_factory=time.monotonic)


def with_epoch(point: Point) -> str:
    """A running point's name, with its epoch where its journal says it (local warm workers, a server)."""
    done = sweep_file.epoch_done(point.dir)
    return point.name if done is None else f"{point.name} (epoch {done}/{point.trainer.epochs})"


def watch(
    runner: Runner,
    todo: list[Point],
    total: int,
    skipped: int,
    poll_s: float,
    earlier: dict | None = None,
    more: Callable[[Flight], list[Point]] | None = None,
    each: Callable[[Flight], None] | None = None,
    ahead: Flight | None = None,
    label: str = "sweep",
) -> Flight:
    """Run ``todo`` to its end (or to an interrupt), and watch ``earlier`` (index -> (point, job)
    an earlier sweep left running) to theirs; ``total`` and ``skipped`` are for the counts.
    ``more``: a search's next points, asked at every step (sweeper/search/study.py); the watch ends once
    it gives none and nothing is queued or running. ``each``: called after every step (the runs
    warm workers handed off, sent). ``ahead``: ``todo``'s flight, started before the store was
    open (sweeper/track/ahead.py). ``label``: the progress line's."""
    flight = ahead or Flight(list(todo), running=dict(earlier or {}), earlier=set(earlier or {}))
    flight.started = {**flight.started, **{i: p for i, (p, _job) in flight.running.items()}}
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with display.Progress(total, label, flight.t0) as progress:
            while True:  # at least one step: with nothing to run, it tells early workers so
                if more is not None:
                    with interrupts_held():
                        flight.queued.extend(more(flight))
                step(runner, flight)
                if each is not None:
                    each(flight)
                failed = sum(e is not None for e in flight.finished.values())
                pending = runner.pending()
                waiting = min(len(flight.running), sum(pending.values())) if runner.job_a_point else 0  # not started
                counts = {
                    "queued": len(flight.queued) + waiting,
                    "running": len(flight.running) - waiting,
                    "done": len(flight.finished) - failed,
                    "failed": failed,
                    "skipped": skipped,
                }
                running = [p for p, _job in flight.running.values()][waiting:]
                progress.update(counts, pending, [with_epoch(p) for p in running[: display.NAMED]], len(running))
                if not (flight.queued or flight.running):
                    with interrupts_held():
                        new = [] if more is None else more(flight)
                    if not new:  # a search's last trials told
                        break
                    flight.queued.extend(new)
                    continue
                time.sleep(poll_s)
    except KeyboardInterrupt:
        flight.interrupted = True
        for s in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not leave the runs RUNNING
            signal.signal(s, _absorb)
        display.console.print("[red]interrupted: cancelling the sweep's jobs[/red]")
        cancel_all(runner, flight, poll_s)
    finally:
        if not flight.interrupted:
            signal.signal(signal.SIGTERM, previous)
    return flight


def step(runner: Runner, flight: Flight) -> None:
    """Start what can start, then collect what ended and give its resources back."""
    for p, job in runner.start(flight.queued):
        flight.running[p.index] = (p, job)
        flight.started[p.index] = p
        flight.logs[p.index] = link_logs(p, job)
    for index, (_p, job) in list(flight.running.items()):
        if job.done():
            flight.finished[index] = job.exception()
            if index not in flight.earlier:
                runner.release(job)
            del flight.running[index]


def cancel_all(runner: Runner, flight: Flight, poll_s: float) -> None:
    jobs = [job for _p, job in flight.running.values()]
    for job in jobs:
        runner.cancel(job)
    runner.stop()
    deadline = time.monotonic() + CANCEL_GRACE_S
    while time.monotonic() < deadline and not all(job.done() for job in jobs):
        time.sleep(poll_s)
    for job in jobs:
        if not job.done():
            job.cancel(check=False)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait for the end of the block, then interrupt: a search's Optuna writes
    (SQLite) cut halfway left the study's store locked, and the interrupted sweep could not fail
    its trials there ("database is locked")."""
    seen: list[int] = []
    held = {s: signal.signal(s, lambda signum, _frame: seen.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)
    if seen:
        raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_noted() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM while the sweep ends (its outcomes, report and closing lines): noted in the
    list yielded, said in a line, and the end goes on; the sweep then exits 130."""
    seen: list[int] = []

    def note(signum: int, _frame: Any) -> None:
        seen.append(signum)
        display.console.print("[red]interrupted: the sweep's end (its table and report) first, a moment[/red]")

    held = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield seen
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _absorb(_signum: int, _frame: Any) -> None:
    """Ctrl-C or SIGTERM again, while the sweep ends its jobs and runs: it finishes that first."""
    display.console.print("[red]still cleaning up: the sweep's runs are being ended, a moment[/red]")
