"""The report's figures drawn side by side in child processes: each figure is a few hundred
milliseconds of matplotlib, and a report has up to eight. The sweep starts the pool while its
points run (:func:`warm_up`: the children import matplotlib meanwhile), a child a core in two
(one on two cores: the sweeper draws every other figure meanwhile); without it, each figure is
drawn here, in turn."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

_pool: ProcessPoolExecutor | None = None
PR_SET_PDEATHSIG = 1  # prctl(2)
_workers = 0  # the pool's children
_drawn = 0  # figures asked for so far


def warm_up(workers: int | None = None) -> None:
    """Start the children (a core in two, at most 4) and have them import what drawing needs; the
    sweeper draws a figure in every ``n + 1`` itself. On one core none."""
    global _pool, _workers
    n = workers or min(4, (os.cpu_count() or 1) // 2)
    if _pool is not None or n < 1:
        return
    _workers = n
    # The children start with SIGINT ignored (an ignored signal stays so across exec): a terminal's
    # Ctrl-C reaches its whole process group, and the sweeper, not they, ends the sweep.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _pool = ProcessPoolExecutor(n, multiprocessing.get_context("spawn"), initializer=_imports)
        for _ in range(n):
            _pool.submit(int)  # each child starts, and imports, now
    finally:
        signal.signal(signal.SIGINT, previous)


def _imports() -> None:
    if sys.platform == "linux":  # SIGTERM when the sweeper is gone (SIGKILLed, it shuts down no pool)
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() == 1:  # gone before that
            os._exit(0)
    import sweeper.report.convergence  # matplotlib and every figure's module
    import sweeper.report.roofline
    import sweeper.report.scaling  # noqa: F401

    _draw_once()


def _draw_once() -> None:
    """A small figure drawn and thrown away: a process's first figure also loads the fonts and
    fills the renderer's caches (0.15-0.25 s), paid here while the points run."""
    from io import BytesIO

    from sweeper.report.plotting import grid, plt

    fig, axes = grid(1, 1)
    axes[0][0].plot([1, 2], [1, 2], label="warm-up")
    axes[0][0].set_xscale("log")
    axes[0][0].legend()
    fig.suptitle("warm-up")
    fig.savefig(BytesIO(), format="png", bbox_inches="tight")
    plt.close(fig)


def draw(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """``fn(*args)`` in a child where the pool runs (but one figure in every ``n + 1``, drawn here
    while the children draw theirs), else here; its result as a future either way."""
    global _drawn
    _drawn += 1
    if _pool is not None and _drawn % (_workers + 1):
        return _pool.submit(fn, *args)
    future: Future[Any] = Future()
    try:
        future.set_result(fn(*args))
    except BaseException as e:
        future.set_exception(e)
    return future


def stop() -> None:
    """End the children. Waited for: the interpreter's exit joins the pool's thread anyway, and one
    left to close its wake-up pipe while that exit wakes it raced (EBADF at the sweep's very end)."""
    global _pool
    pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)
