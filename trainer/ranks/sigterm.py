"""SIGTERM in a rank (scancel, the end of a job, the sweeper's clean-up): the run ends KILLED.

The handler raises :class:`Terminated` once and remembers it: a library may turn the exception into
its own error on the way up (SQLAlchemy wraps what interrupts a query), or swallow it (a bare
``except:``), and the run must still end KILLED (:func:`check`, between epochs), and a warm
worker serve no further point. Inside :func:`deferred` (a write to the store, a gradient sum that
every rank has come to) it is raised when the block ends, not halfway through it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

_seen = False
_deferring = 0  # the main thread's depth in deferred() blocks
_pending = False  # SIGTERM came inside one: raised at its end


class Terminated(BaseException):
    """SIGTERM reached a rank: end the run KILLED, like Ctrl-C."""


def install() -> None:
    signal.signal(signal.SIGTERM, _raise_terminated)


def seen() -> bool:
    """Whether this process has received SIGTERM: it is ending, whatever error it raised since."""
    return _seen


def check() -> None:
    """Raise :class:`Terminated` where a SIGTERM came but its exception never arrived: a library's
    bare ``except:`` swallowed it (Cython's module init does: a SIGTERM during numpy.random's import
    trained a point to its end). Called between epochs, so the run still ends KILLED."""
    global _pending
    if _seen and not _deferring:
        _pending = False  # raised here: not again at the end of a write on the failure path
        raise Terminated("terminated by SIGTERM")


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """SIGTERM waits for the end of the block. A SQLite write interrupted halfway left the store's
    lock held by a worker that then never ended: the other workers waited for it (#33 item 10); a
    rank leaving a gradient sum that its peers had entered would leave them waiting in MPI.
    Only the main thread's blocks count: the handler runs there, and must raise there."""
    global _deferring, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if _pending and not _deferring:
            _pending = False
            raise Terminated("terminated by SIGTERM")


def _raise_terminated(_signum: int, _frame: Any) -> None:
    global _seen, _pending
    _seen = True
    # Once: Slurm signals every process of the step, so a second SIGTERM (from the job's wrapper)
    # must not interrupt the recording of the first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _deferring:
        _pending = True
        return
    raise Terminated("terminated by SIGTERM")
