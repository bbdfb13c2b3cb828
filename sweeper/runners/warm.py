"""Warm workers: points of one kind queued in a folder, served by ranks that start once.

A queue holds the points one worker start can serve: the same shape (ranks, nodes, GPUs), GEMM
mode and mpiexec. Locally a queue is a shape's points, served by as many workers as fit at once;
on Slurm it is one allocation's chunk. Workers claim points as they go (trainer/worker.py); the
pool turns each claim into a :class:`Ticket`, the Job the watch loop follows, and restarts a
worker that died with points left, a bounded number of times. The runner that owns the pool
decides where and how workers start (``launch``) and what they hold (``free``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from sweeper.job import job_end
from sweeper.job.point_job import SOME_FAILED, PointCancelledError, PointFailedError
from sweeper.runners.sbatch import SETUP_FAILED
from trainer.gpu import policy
from trainer.lifecycle import queue_files as protocol
from trainer.lifecycle.requeue import KILLED_STATUS
from trainer.ranks.processes import owner

if TYPE_CHECKING:
    from sweeper.points import Point
    from sweeper.runners.base import Job

AHEAD_POINTS = 64  # a grid queue's first points whose configs its workers get before the tickets


def queue_key(point: Point) -> tuple:
    """What one worker start fixes for every point it serves."""
    t = point.trainer
    return (point.shape, t.gpu.gemm.value == "tf32", t.mpi.mpiexec)


@dataclass
class Queue:
    dir: Path
    points: list[Point]
    workers: dict[str, Job] = field(default_factory=dict)  # worker name -> its job
    ended: set[str] = field(default_factory=set)  # workers whose end the pool has handled
    restarts: int = 0
    given_up: str = ""  # why no worker serves the rest: the points left fail (or are KILLED) with it
    last_ended: Job | None = None  # the worker whose end gave the queue up: its logs say why
    sealed: bool = False  # its tickets are written: workers may end when it is empty
    streaming: bool = False  # a search's: tickets come while its workers train (put), until the seal
    ticketed: set[int] = field(default_factory=set)  # a streaming queue's points given their ticket

    @property
    def nproc(self) -> int:
        return self.points[0].nproc

    @property
    def env(self) -> dict[str, str]:
        """The workers': CuPy's GEMM mode, and the data set they load while the sweeper records."""
        t = self.points[0].trainer
        env = {protocol.DATA_HINT: json.dumps(protocol.data_key(t))}
        return env | policy.tf32_env(t.gpu.gemm.value)

    @property
    def mpiexec(self) -> str | None:
        return self.points[0].trainer.mpi.mpiexec

    def open(self) -> None:
        """The queue's folders, empty: workers started now wait for :meth:`seal` (or for this
        process's end: the owner file names it)."""
        for sub in (protocol.TODO, protocol.CLAIMED):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / protocol.OWNER).write_text(owner())
        if self.streaming:
            (self.dir / protocol.STREAMING).touch()
            return
        for p in self.points[:AHEAD_POINTS]:  # their references start before the tickets, on a GPU worker
            protocol.write_ahead(self.dir, p.index, OmegaConf.to_container(p.trainer, resolve=True, enum_to_str=True))

    def put(self, point: Point) -> None:
        """A streaming queue's point's ticket, at once claimable (once)."""
        if point.index not in self.ticketed:
            protocol.write_ticket(self.dir, point.index, point.dir.resolve())
            self.ticketed.add(point.index)

    def seal(self, points: list[Point]) -> None:
        """One ticket per point to run, named so that workers take them in the sweep's order, then
        the seal: a worker that finds the queue sealed and empty ends."""
        for p in points:
            protocol.write_ticket(self.dir, p.index, p.dir.resolve())
        (self.dir / protocol.SEALED).touch()
        self.sealed = True

    def unclaimed(self) -> int:
        """Points no worker has taken yet (before a grid's seal: every point it may get)."""
        if self.streaming and not self.sealed:  # its tickets so far; before any, the first worker's due
            return len(self.ticketed) - len(self.claims()) if self.ticketed else 1
        if not self.sealed:
            return len(self.points)
        return sum(1 for _ in (self.dir / protocol.TODO).iterdir())

    def claims(self) -> dict[int, str]:
        """Point index -> the name of the worker that claimed it."""
        out = {}
        for f in (self.dir / protocol.CLAIMED).iterdir():
            index, name = f.name.split(".", 1)
            out[int(index)] = name
        return out

    def live(self) -> list[str]:
        return [n for n in self.workers if n not in self.ended]

    def idle(self) -> bool:
        """A streaming queue whose workers hold no point: every ticket claimed, each claimed point's
        result written."""
        claims = self.claims()
        if len(self.ticketed) > len(claims):
            return False
        dirs = {p.index: p.dir for p in self.points}
        return all((dirs[i] / protocol.RESULT).exists() for i in claims if i in dirs)


def withdraw_unclaimed(sweep_dir: Path) -> int:
    """The tickets no worker of an earlier sweep (its sweeper gone) has claimed: removed, and its
    queues sealed, so that its live workers end after their points (and one still waiting for its
    tickets ends at once) while the sweep that closed it runs the rest. Returns how many."""
    tickets = list(sweep_dir.glob(f".submitit/queues/*/{protocol.TODO}/*"))
    for ticket in tickets:
        ticket.unlink(missing_ok=True)
    for queue in sweep_dir.glob(".submitit/queues/*"):
        (queue / protocol.SEALED).touch()
    return len(tickets)


class Ticket:
    """One point in a worker's hands, as the watch loop sees a job: done once the worker wrote
    the point's result, or ended without writing it."""

    def __init__(self, point: Point, worker: Job | None, name: str, failure: str = "", paths: Any = None) -> None:
        """``paths``: where the logs are of the worker that gave its queue up, for a point none took."""
        self.point, self.worker, self.name, self.failure = point, worker, name, failure
        self.job_id = f"{worker.job_id}/{name}" if worker is not None else "none"
        self.paths = worker.paths if worker is not None else paths

    def _result(self) -> dict | None:
        try:
            return json.loads((self.point.dir / protocol.RESULT).read_text())
        except (OSError, ValueError):
            return None

    def done(self) -> bool:
        if self.worker is None or self._result() is not None:
            return True
        return self.worker.done() or self._result() is not None  # it may have written it meanwhile

    def exception(self) -> BaseException | None:
        if self.worker is None:
            return PointFailedError(self.failure)
        result = self._result()
        if result is not None:
            if result["status"] == 0:
                return None
            detail = _tail(self.point.dir / "worker_error.txt")
            if result["status"] == KILLED_STATUS:  # its run ended KILLED: scancel, a Ctrl-C, a time limit
                return PointCancelledError(f"CANCELLED: point ended on SIGTERM in worker {result['worker']}{detail}")
            return PointFailedError(f"point ended with status {result['status']} in worker {result['worker']}{detail}")
        return PointFailedError(f"worker {self.name} ended while running this point: {ended_how(self.worker)}")

    def cancel(self, check: bool = True) -> None:
        if self.worker is not None:
            self.worker.cancel(check=check)


def ended_how(job: Job) -> str:
    """Why a worker's job ended (its first line: the state and the error; then the cause's lines from
    its logs); says CANCELLED when the scheduler or the sweep cancelled it. Asked once per job:
    submitit waits seconds for the result file of a job killed before it wrote one."""
    if job.job_id not in _ENDED_HOW:
        _ENDED_HOW[job.job_id] = job_end.describe(job)
    return _ENDED_HOW[job.job_id]


_ENDED_HOW: dict[str, str] = {}
_UNSTARTED: set[str] = set()  # jobs a runner ended because they never started their task


def unstarted(job_id: str, why: str) -> None:
    """A runner ended this worker's job, which never started its task: restarted without asking
    submitit (which waits 15 s for the result of a job that wrote nothing, twice)."""
    _ENDED_HOW[job_id] = why
    _UNSTARTED.add(job_id)


def _tail(path: Path) -> str:
    try:
        return ": " + path.read_text().strip().splitlines()[-1]
    except (OSError, IndexError):
        return ""


class WarmPool:
    """The queues of a sweep and their workers."""

    def __init__(self, folder: Path, max_restarts: int) -> None:
        self.folder, self.max_restarts = folder, max_restarts
        self.queues: list[Queue] = []
        self.started: set[int] = set()  # point indices handed to the watch loop
        self.stopping = False
        self._names = 0

    def add(self, points: list[Point], chunk: int | None = None, seal: bool = True) -> list[Queue]:
        """Queue ``points`` (in order) by kind, ``chunk`` points at most per queue; without
        ``seal``, the queues stay open for workers started early (:meth:`seal` them later)."""
        by_key: dict[tuple, list[Point]] = {}
        for p in points:
            by_key.setdefault(queue_key(p), []).append(p)
        added = []
        for members in by_key.values():
            size = chunk or len(members)
            for i in range(0, len(members), size):
                q = Queue(self.folder / "queues" / f"q{len(self.queues)}", members[i : i + size])
                q.open()
                if seal:
                    q.seal(q.points)
                self.queues.append(q)
                added.append(q)
        return added

    def put(self, points: list[Point], tickets: bool = True) -> None:
        """A search's points (sweeper/search/study.py), each in its kind's streaming queue (opened for a
        kind not seen before), with its ticket; without ``tickets``, points that stand for their
        kinds: the queues open and their workers start before any trial is asked."""
        for p in points:
            q = next((q for q in self.queues if q.streaming and queue_key(q.points[0]) == queue_key(p)), None)
            if q is None:
                q = Queue(self.folder / "queues" / f"q{len(self.queues)}", [], streaming=True)
                q.open()
                self.queues.append(q)
            if p not in q.points:
                q.points.append(p)
            if tickets:
                q.put(p)

    def end_streams(self) -> None:
        """A search asked for its last trial: its queues sealed, their workers end once idle."""
        for q in self.queues:
            if q.streaming and not q.sealed:
                q.seal([])

    def seal(self, queued: list[Point]) -> None:
        """Tickets for the points still to run (the others were recorded before: resumed), in
        every open queue."""
        todo = {p.index for p in queued}
        for q in self.queues:
            if not q.sealed and not q.streaming:
                q.seal([p for p in q.points if p.index in todo])

    def new_name(self) -> str:
        self._names += 1
        return f"w{self._names}"

    def needs_workers(self, q: Queue) -> int:
        """How many more workers ``q`` could use now."""
        if q.given_up or self.stopping:
            return 0
        return max(0, q.unclaimed() - len(q.live()))

    def tickets(self, queued: list[Point]) -> list[tuple[Point, Ticket]]:
        """Points claimed since the last call (and the points of queues given up), as tickets;
        removed from ``queued``."""
        out = []
        by_index = {p.index: p for p in queued}
        for q in self.queues:
            claims = q.claims()
            for p in q.points:
                if p.index in self.started or p.index not in by_index:
                    continue
                if p.index in claims:
                    name = claims[p.index]
                    ticket = Ticket(p, q.workers.get(name), name, f"worker {name} is not one of this sweep's")
                elif q.given_up:
                    paths = q.last_ended.paths if q.last_ended is not None else None
                    ticket = Ticket(p, None, "none", q.given_up, paths)
                else:
                    continue
                self.started.add(p.index)
                queued.remove(p)
                out.append((p, ticket))
        return out

    def ended_workers(self) -> list[tuple[Queue, str, Job]]:
        """Workers that ended since the last call; a queue whose worker died with points left gets
        a restart, or, past ``max_restarts`` or when cancelled, is given up."""
        out = []
        for q in self.queues:
            for name, job in q.workers.items():
                if name in q.ended or not job.done():
                    continue
                q.ended.add(name)
                out.append((q, name, job))
                if q.unclaimed() == 0 or q.given_up:
                    continue
                how = ended_how(job)
                q.last_ended = job
                if self.stopping or job_end.cancelled(how):  # scancel, Ctrl-C, a time limit: no restart
                    q.given_up = f"CANCELLED: the worker's job was cancelled before this point ran ({how})"
                elif SETUP_FAILED in how:  # the same lines fail every allocation: no restart
                    q.given_up = how
                elif job.job_id in _UNSTARTED or (job.exception() is not None and SOME_FAILED not in how):
                    q.restarts += 1
                    if q.restarts > self.max_restarts:
                        q.given_up = f"gave up after {self.max_restarts} worker restart(s); the last: {how}"
        return out

    def live_jobs(self) -> list[Any]:
        return [q.workers[n] for q in self.queues for n in q.live()]
