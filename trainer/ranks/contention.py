"""What else trained on this host while a run's batches were timed, and the host to itself where a
run's timing must be alone (``perf.timing=exclusive``).

Rank 0 of every run holds the host's timing lock while its batches are timed: shared beside other
shared runs (the default), or exclusive, waiting for the runs timing now, which wait for it in turn.
It also leaves a marker in the host's folder (``SWEEPSCALE_TIMING_DIR``, else
``<tmp>/sweepscale-timing``): its name, GPUs and the span of its timed batches, kept an hour after
it ends. At the end it counts the other runs whose spans overlapped its own: the report computes
speedups from timings that had none (sweeper/report/families.py). Each rank also measures how
long it waited for a core meanwhile (:class:`CoreWait`): the processes that are not runs. One
host's view: rank 0 sees its own node, and a Slurm job with a private /tmp sees no other job
(point SWEEPSCALE_TIMING_DIR at a node-local folder that all jobs share).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.ranks import parallel
from trainer.ranks.processes import alive

DIR_ENV = "SWEEPSCALE_TIMING_DIR"
KEEP_S = 3600  # an ended run's marker stays this long: the runs that overlapped it still read it


def folder() -> Path:
    path = Path(os.environ.get(DIR_ENV) or Path(tempfile.gettempdir()) / "sweepscale-timing")
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # every user's runs on this host share it, as /tmp
            path.chmod(0o1777)
    return path


class TimedSpan:
    """Rank 0's timed batches: ``with TimedSpan(...) as span:`` around them; then
    :attr:`beside` names the runs that overlapped them and :attr:`waited_s` the wait for the host."""

    def __init__(
        self, name: str, exclusive: bool, units: str, say: Callable[[str], None] = print, gpus: list[str] | None = None
    ) -> None:
        self.name, self.exclusive, self.units, self.say = name, exclusive, units, say
        self.gpus = gpus  # the GPUs its ranks compute on; None: CPU ranks (every run of the host shares their cores)
        self.beside: list[str] = []
        self.alongside: list[str] = []  # GPU runs on other GPUs of the host meanwhile: not company (docs/benchmarks.md)
        self.waited_s = 0.0
        self.fd: int | None = None
        self.marker: Path | None = None
        self.start = self.end = 0.0

    def __enter__(self) -> TimedSpan:
        where = folder()
        self.fd = os.open(where / "host.lock", os.O_RDWR | os.O_CREAT, 0o666)
        mode = fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH
        t0 = time.perf_counter()
        try:
            fcntl.flock(self.fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            why = "other runs' batches are timing" if self.exclusive else "a run with perf.timing=exclusive is timing"
            self.say(f"waiting for this host: {why} ({where})")
            fcntl.flock(self.fd, mode)
        self.waited_s = time.perf_counter() - t0
        self.start = time.time()
        self.marker = where / f"{socket.gethostname()}.{os.getpid()}.{time.time_ns()}.json"
        self._write(None)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.end = time.time()
        self._write(self.end)
        if self.fd is not None:
            os.close(self.fd)  # the lock goes with the descriptor
            self.fd = None
        self.beside, self.alongside = self._overlapping()

    def _write(self, end: float | None) -> None:
        entry = {"run": self.name, "units": self.units, "host": socket.gethostname(), "pid": os.getpid()}
        entry["gpus"] = self.gpus
        entry.update(start=self.start, end=end)
        part = self.marker.with_suffix(".part")
        part.write_text(json.dumps(entry))
        part.replace(self.marker)  # readers see a whole marker or none

    def _overlapping(self) -> tuple[list[str], list[str]]:
        """The other runs of this host whose timed batches overlapped these, as (company, alongside):
        alongside, GPU runs on none of this GPU run's GPUs; stale markers go."""
        found, apart, host, now = [], [], socket.gethostname(), time.time()
        for path in self.marker.parent.glob("*.json"):
            if path == self.marker:
                continue
            try:
                other = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # gone meanwhile
            if other.get("host") != host:
                continue
            end = other.get("end")
            if (end is not None and now - end > KEEP_S) or (end is None and not alive(other.get("pid", 0))):
                with contextlib.suppress(OSError):
                    path.unlink()  # long ended, or its process died timing
                continue
            if other["start"] < self.end and (end is None or end > self.start):
                theirs = other.get("gpus")
                disjoint = self.gpus is not None and theirs is not None and not set(self.gpus) & set(theirs)
                (apart if disjoint else found).append(f"{other['run']} ({other['units']})")
        return sorted(found), sorted(apart)


class CoreWait:
    """The share of its wall time, from now, that this thread waits runnable for a core: 0 on a core
    of its own, about 1/2 beside one other busy process on it. Timed batches that waited so were
    slowed by whatever else ran there (on a CPU sweep: the sweeper's start-up, other workers), which
    no marker names. None where the kernel keeps no schedstat (/proc/thread-self/schedstat: Linux)."""

    def __init__(self) -> None:
        self.waited, self.t0 = run_delay_s(), time.perf_counter()

    def share(self) -> float | None:
        now = run_delay_s()
        if self.waited is None or now is None:
            return None
        return (now - self.waited) / max(time.perf_counter() - self.t0, 1e-9)


def worst_wait(comm: Any, share: float | None) -> float | None:
    """The largest :meth:`CoreWait.share` of the ranks of ``comm`` (every rank calls it); None where
    none could measure it."""
    ppm = parallel.agree(comm, -1 if share is None else round(share * 1e6), "max")
    return None if ppm < 0 else ppm / 1e6


def run_delay_s() -> float | None:
    """Seconds this thread has spent runnable, waiting for a core, since it started."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def for_run(name: str | None, exclusive: bool, nproc: int, device: str) -> TimedSpan:
    """A run's span: named by its run name, its units by its ranks and their GPUs."""
    units = f"{nproc} rank(s) on {device}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if device == "gpu" and visible:
        units += f" {visible}"
    # A GPU run's GPUs, where the launcher gave it its own (CUDA_VISIBLE_DEVICES); unknown: shares them all.
    gpus = [g.strip() for g in visible.split(",") if g.strip()] if device == "gpu" and visible else None
    return TimedSpan(name or f"pid {os.getpid()}", exclusive, units, gpus=gpus)
