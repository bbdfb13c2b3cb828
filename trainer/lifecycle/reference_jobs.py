"""The CPU reference beside the run: computed in other processes while the run trains, and after.

Rank 0 submits the reference when its run starts (on a GPU; on the CPU after its timed batches);
the run ends when its training does, and the reference's error lands in it later (trainer/run.py).
A key whose weights are cached is read in a thread of this process, with no child at all.
Otherwise a spawned child (a pool per process, kept across the points of a warm worker, several
references computing at once) trains the sequential NumPy run's first k steps on the run's own
training arrays, mapped from shared memory where this process put them once per data set
(trainer/lifecycle/shared_arrays.py). Each
child's BLAS threads are the cores the GPUs' ranks leave, shared among the references computing on
this machine (re-counted after every step from marker files in the cache folder). A file
lock per key makes processes that need one reference at once compute it once: the others wait,
then read its file.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.core import model, reference
from trainer.core.loop import Schedule
from trainer.lifecycle import shared_arrays
from trainer.lifecycle.shared_arrays import SharedArray
from trainer.ranks.backend import usable_cores, visible_gpus
from trainer.ranks.processes import alive

RUNNING = ".running"  # in the cache folder: one marker per reference computing, "<host>.<pid>"
CORES_ENV = "SWEEPSCALE_CORES"  # the cores a CPU job holds, where its runner says (sweeper/runners/local.py)


def cores() -> int:
    """The cores this process may run on: its job's where the runner says, else the machine's."""
    if os.environ.get(CORES_ENV, "").isdigit():
        return int(os.environ[CORES_ENV])
    return usable_cores()


# References at once per process: a quarter of the cores (the headline's three at once on 16), at least one.
WORKERS = max(1, min(8, cores() // 4))


@dataclass(frozen=True)
class Reference:
    params: np.ndarray  # the sequential run's weights after its first k steps
    cached: bool  # read from the cache (computed earlier, or by another process while this one waited)
    key: str


class Job:
    """One reference on its way: :meth:`done` never blocks, :meth:`result` waits (and raises its error)."""

    def __init__(self) -> None:
        self.future: Future[Reference] = Future()
        self.handed = threading.Event()  # this process's part done: read from the cache, failed, or with a child

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> Reference:
        return self.future.result(timeout)


def submit(
    x: np.ndarray,
    y: np.ndarray,
    fingerprint: Callable[[], str],
    key_of: Callable[[str], str],
    layout: model.Layout,
    init: np.ndarray,
    schedule: Schedule,
    steps: int,
    cache: str | Path,
) -> Job:
    """Start the reference of ``steps`` steps on the training arrays ``x``, ``y`` and return at once.
    ``fingerprint`` (the data's hash) and ``key_of`` (the cache key of a fingerprint) run in a thread
    here: hashing the data would delay the first batch."""
    cache = Path(cache).expanduser().absolute()  # the child must not depend on this process's cwd
    job = Job()
    args = (job, x, y, fingerprint, key_of, layout, init, schedule, steps, cache)
    threading.Thread(target=_prepare, args=args, name="reference", daemon=True).start()
    return job


def _prepare(
    job: Job,
    x: np.ndarray,
    y: np.ndarray,
    fingerprint: Callable[[], str],
    key_of: Callable[[str], str],
    layout: model.Layout,
    init: np.ndarray,
    schedule: Schedule,
    steps: int,
    cache: Path,
) -> None:
    global _sent
    try:
        hashed = fingerprint()
        key = key_of(hashed)
        if (weights := reference.cached(cache, key)) is not None:  # no process needed
            job.future.set_result(Reference(weights, True, key))
            return
        data = shared_arrays.share(hashed, x, y)
        future = _pool_submit(compute, data, layout, init, schedule, steps, cache, key)
        with _pool_lock:
            _sent += 1
        job.handed.set()
        params, cached = future.result()
        job.future.set_result(Reference(params, cached, key))
    except BaseException as e:  # the check fails with this error; the run it checks is not touched
        job.future.set_exception(e)
    finally:
        job.handed.set()


def compute(
    data: tuple[SharedArray, SharedArray],
    layout: model.Layout,
    init: np.ndarray,
    schedule: Schedule,
    steps: int,
    cache: Path,
    key: str,
) -> tuple[np.ndarray, bool]:
    """In the child: the reference's weights and whether they were cached, computed at most once per
    key whatever the number of processes asking (the first takes the lock; the others read its file)."""
    from threadpoolctl import ThreadpoolController

    if _begun is not None:  # its parent may go on: nothing of this reference is left for it to send
        with _begun.get_lock():
            _begun.value += 1
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or by the kernel if this process dies
        if (weights := reference.cached(cache, key)) is not None:  # the first to hold the lock wrote it
            return weights, True
        x, y = (shared_arrays.attach(a) for a in data)
        blas, threads = ThreadpoolController(), 0
        with _Running(cache) as running:

            def share(done: int = 0) -> None:  # now, and after each step: the references come and go
                nonlocal threads
                if (n := running.share((steps - done) * layout.size * schedule.batch_size)) != threads:
                    blas.limit(limits=n, user_api="blas")
                    threads = n

            share()
            return reference.reference_params(layout, init, x, y, schedule, steps, cache, key, share)


class _Running:
    """This child's marker among the references computing on this host, while it computes, and its
    share of the cores: those the GPUs' ranks leave (a core each, to drive its GPU), shared among the
    references computing on this host now in proportion to the work each has left (its marker says
    how much), so that the largest, which the sweep waits for, is not held to an equal share."""

    def __init__(self, cache: Path) -> None:
        self.folder = cache / RUNNING
        self.marker = self.folder / f"{socket.gethostname()}.{os.getpid()}"
        self.reserved = visible_gpus()  # the training beside: its ranks must not wait for cores

    def __enter__(self) -> _Running:
        self.folder.mkdir(exist_ok=True)
        self.marker.touch()
        return self

    def share(self, work: int) -> int:
        """Threads for this reference, which has ``work`` left (any unit common to all: multiply-adds)."""
        self.marker.write_text(str(work))
        host, total = socket.gethostname(), 0
        for m in self.folder.iterdir():
            name, _, pid = m.name.rpartition(".")
            if name == host and pid.isdigit() and alive(int(pid)):
                try:
                    said = m.read_text() if m != self.marker else str(work)
                except OSError:  # that reference ended meanwhile
                    continue
                total += int(said) if said.isdigit() else work  # a marker just made counts as much as this
            elif name == host:
                m.unlink(missing_ok=True)  # a child that died computing
        return max(1, (cores() - self.reserved) * work // max(1, total, work))

    def __exit__(self, *exc: Any) -> None:
        self.marker.unlink(missing_ok=True)


def handed_over(jobs: list[Job], timeout: float) -> None:
    """Wait, at most ``timeout`` s, until these references need nothing more of this process: each
    read from the cache, failed, or begun in a child. Asked before MPI's start, which holds the GIL
    for its 0.5-0.7 s (Open MPI): their hashing, sharing and sending would wait for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(j.handed.is_set() for j in jobs) and (_begun is None or _begun.value >= _sent):
            return
        time.sleep(0.005)


def warm() -> None:
    """Start the pool's processes now (each imports NumPy and this module, a few tenths of a second)
    rather than when the first references are asked for."""
    for _ in range(WORKERS):
        _pool_submit(int)


_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()
_sent = 0  # references given to the pool's children
_begun: Any = None  # how many of them the children have begun: a shared counter, given to each child at its start
_busy: set[Future[Any]] = set()  # the children's jobs not done yet
_closed = threading.Event()


def _pool_submit(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    global _pool, _begun
    with _pool_lock:
        if _closed.is_set():  # shutdown() is tearing the pool down: no child to start for it
            raise RuntimeError("the reference's process pool is shutting down")
        for _ in range(2):
            if _pool is None:
                # spawn, never fork: this process has MPI and maybe a CUDA context.
                context = multiprocessing.get_context("spawn")
                if _begun is None:
                    _begun = context.Value("l", 0)
                _pool = ProcessPoolExecutor(WORKERS, context, initializer=_child_init, initargs=(os.getpid(), _begun))
            try:
                future = _pool.submit(fn, *args)
                _busy.add(future)
                future.add_done_callback(_busy.discard)
                return future
            except BrokenProcessPool:  # a child was killed: the next reference gets a fresh pool
                _pool = None
        raise RuntimeError("the reference's process pool broke twice in a row")


def shutdown() -> None:
    """End the pool (the run or the worker is ending) and free the shared arrays; a child still
    computing is killed: once no run waits for its reference, nothing needs it. A later run in this
    process (launcher=debug runs every point in one) starts a fresh pool."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
        _closed.set()  # no child starts while this one is being torn down
    try:
        if pool is not None:
            if _busy:  # Python 3.11 has no public way to stop a busy child (3.14: terminate_workers)
                for process in list((getattr(pool, "_processes", None) or {}).values()):
                    process.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
        shared_arrays.free()
    finally:
        _closed.clear()


def _child_init(parent: int, begun: Any) -> None:
    global _begun
    _begun = begun
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle: it ends this pool
    threading.Thread(target=_exit_with, args=(parent,), name="orphan-check", daemon=True).start()
    import threadpoolctl  # noqa: F401  (what compute needs, imported before a reference waits for it)


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)  # the rank died (MPI_Abort, SIGKILL): nobody waits for this reference any more
