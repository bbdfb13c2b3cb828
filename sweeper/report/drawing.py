"""The report's figures drawn side by side in child processes: each figure is a few hundred
milliseconds of matplotlib, and a report has up to eight. The sweep starts the pool with its
workers where cores are idle then, else with its runs (:func:`warm_up`: the children import
matplotlib meanwhile), a child a core in two (one on two cores); a figure asked while every child
draws is drawn here meanwhile; without children, each figure is drawn here, in turn."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

_pool: ProcessPoolExecutor | None = None
# From this many cores the drawing children start before the store is open, the sweeper's imports with the runs.
EARLY_CORES = 8
PR_SET_PDEATHSIG = 1  # prctl(2)
_workers = 0  # the pool's children
_drawing: set[Future[Any]] = set()  # the figures the children draw now
_made: list[tuple[Callable[..., Any], tuple, Future[Any]]] | None = None  # after remember(): function, arguments, made
_here: threading.Thread | None = None  # the sweeper's own import of the report's modules, begun with the runs
_here_lock = threading.Lock()  # a figure drawn in this process, one at a time
_off = ""  # why no figure is drawn (report.figures=false), else ""


def turn_off(why: str) -> None:
    """From now on no figure is drawn and no child started: each figure's future says ``why``,
    which the report shows in its place (report.figures=false: tables and findings only)."""
    global _off
    _off = why


def warm_up(workers: int | None = None, early: bool = False) -> None:
    """Start the children (a core in two, at most 4) and have them import what drawing needs. On
    one core none. ``early``: only where the machine has ``EARLY_CORES`` or more (a GPU machine: the
    workers' start-up and MLflow's import leave most idle); on fewer they would take the cores that
    MLflow's import, which the sweep's first points wait for, needs."""
    global _pool, _workers
    n = workers or min(4, (os.cpu_count() or 1) // 2)
    if _off or _pool is not None or n < 1 or (early and not _spare_cores()):
        return
    _workers = n
    _pool = ProcessPoolExecutor(n, multiprocessing.get_context("spawn"), initializer=_imports)
    for _ in range(n):
        _pool.submit(int)  # each child starts, and imports, now


def warm_up_here() -> None:
    """The report's modules imported here too, in a thread, once the store is open (MLflow's import,
    before, is what the sweep's runs wait for): matplotlib not among them, which only a figure drawn
    here imports (while every child draws one, or without children). Only from ``EARLY_CORES``: on
    fewer, the cores are the workers' while the points run."""
    global _here
    if _here is None and _spare_cores() and not _off:
        _here = threading.Thread(target=_imports_here, name="report-imports", daemon=True)
        _here.start()


def imported() -> None:
    """Wait for :func:`warm_up_here`'s imports: a thread that imports the report meanwhile could
    meet them half done (two threads importing one import cycle at once can fail in one)."""
    if _here is not None:
        _here.join()


def _spare_cores() -> bool:
    return (os.cpu_count() or 1) >= EARLY_CORES


def _imports_here() -> None:
    with contextlib.suppress(Exception):  # the report says what is wrong when it is built
        _report_modules()


def _imports() -> None:
    # A terminal's Ctrl-C reaches the whole process group: the sweeper, not they, ends the sweep. Set
    # here, in the child: the sweeper's own disposition never changes, or a Ctrl-C meanwhile were lost.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A child ends without the teardown of matplotlib's modules: 0.15 s the sweep's end waited for.
    atexit.register(os._exit, 0)
    if sys.platform == "linux":  # SIGTERM when the sweeper is gone (SIGKILLed, it shuts down no pool)
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() == 1:  # gone before that
            os._exit(0)
    _ready_to_draw()


def _ready_to_draw() -> None:
    """Every figure's module imported, matplotlib too, and a first figure drawn."""
    _report_modules()
    _draw_once()


def _report_modules() -> None:
    """Every figure's module (matplotlib only once a figure is drawn), the page's (jinja2), the study's."""
    import sweeper.report.convergence
    import sweeper.report.page
    import sweeper.report.roofline
    import sweeper.report.scaling
    import sweeper.report.study
    import sweeper.report.time_to_target  # noqa: F401


def _draw_once() -> None:
    """A small figure drawn and thrown away: a process's first figure also loads the fonts and
    fills the renderer's caches (0.15-0.25 s), paid here while the points run."""
    from io import BytesIO

    from sweeper.report.plotting import grid, pyplot

    fig, axes = grid(1, 1)
    axes[0][0].plot([1, 2], [1, 2], label="warm-up")
    axes[0][0].set_xscale("log")
    axes[0][0].legend()
    fig.suptitle("warm-up")
    fig.savefig(BytesIO(), format="png")
    pyplot().close(fig)


def draw(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """``fn(*args)`` in an idle child where the pool runs, else here (while every child draws, or
    without children); its result as a future either way. After
    :func:`remember`, a figure drawn before with equal arguments (its file among them) and still on
    disk is not drawn again."""
    if _off:
        left_out: Future[Any] = Future()
        left_out.set_result(_off)  # a figure's reason for being left out, as a figure with nothing to show gives
        return left_out
    if _made is None:
        return _draw(fn, *args)
    for made_fn, made_args, made in _made:
        if made_fn is fn and made.done() and made.exception() is None and _equal(made_args, args) and _kept(made):
            return made
    future = _draw(fn, *args)
    _made.append((fn, args, future))
    return future


def remember() -> None:
    """From now on keep each figure drawn with its arguments: the report built while the checks land
    (sweeper/track/early_report.py) draws what the sweep's own report then reuses."""
    global _made
    if _made is None:
        _made = []


def _kept(made: Future[Any]) -> bool:
    """A figure's file still there (or no file: the reason it was left out)."""
    return not isinstance(made.result(), Path) or made.result().exists()


def _equal(a: tuple, b: tuple) -> bool:
    """Equal arguments: by ``==``, or by their pickles (a NaN read twice from the store is two
    objects that ``==`` calls unequal)."""
    try:
        return bool(a == b) or pickle.dumps(a) == pickle.dumps(b)
    except Exception:  # an argument whose == is no yes or no (an array), or that does not pickle: drawn again
        return False


def _draw(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    if _pool is not None and len(_drawing) < _workers:  # a child is idle
        future = _pool.submit(fn, *args)
        _drawing.add(future)
        future.add_done_callback(_drawing.discard)
        return future
    imported()
    future: Future[Any] = Future()
    with _here_lock:  # pyplot is not drawn from two threads at once (the early report's two)
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
