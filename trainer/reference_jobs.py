"""The CPU reference beside the run: computed in a separate process while the run trains.

Rank 0 submits the reference when its run starts and waits for it only when the run ends. A key
whose weights are cached is read in a thread of this process, with no child at all; otherwise one
spawned child (a pool of one per process, kept across the points of a warm worker) loads the data
itself from the config's data settings and trains the sequential NumPy run. A file lock per key
makes processes that need one reference at once compute it once: the others wait, then read it.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from trainer import model
from trainer.loop import Schedule

# One child: the sequential run's NumPy GEMMs already spread over the cores through BLAS threads.
WORKERS = 1


@dataclass(frozen=True)
class DataSpec:
    """What the child loads the training data from (trainer/data.py load's arguments), never the arrays."""

    dir: str | None
    n_train: int | None
    n_test: int | None
    dtype: str
    scale: str


@dataclass(frozen=True)
class Reference:
    params: np.ndarray  # the sequential run's final weights
    cached: bool  # read from the cache (computed earlier, or by another process while this one waited)
    key: str


class Job:
    """One reference on its way: :meth:`done` never blocks, :meth:`result` waits (and raises its error)."""

    def __init__(self) -> None:
        self.future: Future[Reference] = Future()

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> Reference:
        return self.future.result(timeout)


def submit(
    spec: DataSpec,
    fingerprint: Callable[[], str],
    key_of: Callable[[str], str],
    layout: model.Layout,
    init: np.ndarray,
    schedule: Schedule,
    cache: str | Path,
) -> Job:
    """Start the reference and return at once. ``fingerprint`` (the data's hash) and ``key_of`` (the
    cache key of a fingerprint) run in a thread here: hashing the data would delay the first batch."""
    spec = replace(spec, dir=None if spec.dir is None else str(Path(spec.dir).expanduser().absolute()))
    cache = Path(cache).expanduser().absolute()  # the child must not depend on this process's cwd
    job = Job()
    args = (job, fingerprint, key_of, spec, layout, init, schedule, cache)
    threading.Thread(target=_prepare, args=args, name="reference", daemon=True).start()
    return job


def _prepare(
    job: Job,
    fingerprint: Callable[[], str],
    key_of: Callable[[str], str],
    spec: DataSpec,
    layout: model.Layout,
    init: np.ndarray,
    schedule: Schedule,
    cache: Path,
) -> None:
    try:
        hashed = fingerprint()
        key = key_of(hashed)
        path = cache / f"{key}.npy"
        if path.is_file():  # complete once there (written by os.replace): no process needed
            job.future.set_result(Reference(np.load(path), True, key))
            return
        params, cached = _pool_submit(compute, spec, hashed, layout, init, schedule, cache, key).result()
        job.future.set_result(Reference(params, cached, key))
    except BaseException as e:  # the run that waits for it fails with this error
        job.future.set_exception(e)


def compute(
    spec: DataSpec,
    fingerprint: str,
    layout: model.Layout,
    init: np.ndarray,
    schedule: Schedule,
    cache: Path,
    key: str,
) -> tuple[np.ndarray, bool]:
    """In the child: the reference's weights and whether they were cached, computed at most once per
    key whatever the number of processes asking (the first takes the lock; the others read its file)."""
    from trainer import reference

    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or by the kernel if this process dies
        path = cache / f"{key}.npy"
        if path.is_file():
            return np.load(path), True
        x, y = _training_data(spec, fingerprint)
        return reference.reference_params(layout, init, x, y, schedule, cache, key)


_DATA: dict[DataSpec, tuple[np.ndarray, np.ndarray]] = {}  # in the child: loaded once for every point


def _training_data(spec: DataSpec, fingerprint: str) -> tuple[np.ndarray, np.ndarray]:
    if spec not in _DATA:
        from trainer import data

        ds = data.load(spec.dir, spec.n_train, spec.n_test, spec.dtype, spec.scale)
        if ds.fingerprint() != fingerprint:  # the files changed since the run loaded them
            raise RuntimeError(
                f"the data in {ds.source} are not what the run trained on (fingerprint {ds.fingerprint()}, "
                f"the run's {fingerprint}): was it rewritten meanwhile?"
            )
        _DATA[spec] = (ds.x_train, ds.y_train)
    return _DATA[spec]


_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()
_busy: set[Future[Any]] = set()  # the child's jobs not done yet
_closed = threading.Event()


def _pool_submit(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    global _pool
    with _pool_lock:
        if _closed.is_set():  # shutdown() is tearing the pool down: no child to start for it
            raise RuntimeError("the reference's process pool is shutting down")
        for _ in range(2):
            if _pool is None:
                # spawn, never fork: this process has MPI and maybe a CUDA context.
                context = multiprocessing.get_context("spawn")
                _pool = ProcessPoolExecutor(WORKERS, context, initializer=_child_init, initargs=(os.getpid(),))
            try:
                future = _pool.submit(fn, *args)
                _busy.add(future)
                future.add_done_callback(_busy.discard)
                return future
            except BrokenProcessPool:  # its child was killed: the next reference gets a fresh one
                _pool = None
        raise RuntimeError("the reference's process pool broke twice in a row")


def shutdown() -> None:
    """End the pool (the run or the worker is ending); a child still computing is killed: once no run
    waits for its reference, nothing needs it. A later run in this process (launcher=debug runs
    every point in one) starts a fresh child."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
        _closed.set()  # no child starts while this one is being torn down
    try:
        if pool is None:
            return
        if _busy:  # Python 3.11 has no public way to stop a busy child (3.14: terminate_workers)
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
    finally:
        _closed.clear()


def _child_init(parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle: it ends this pool
    threading.Thread(target=_exit_with, args=(parent,), name="orphan-check", daemon=True).start()


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)  # the rank died (MPI_Abort, SIGKILL): nobody waits for this reference any more
