"""SIGTERM in a rank (scancel, the end of a job, the sweeper's clean-up): the run ends KILLED.

The handler raises :class:`Terminated` once and remembers it: a library may turn the exception into
its own error on the way up (SQLAlchemy wraps what interrupts a query), and the run must still end
KILLED, and a warm worker serve no further point.
"""

from __future__ import annotations

import signal
from typing import Any

_seen = False


class Terminated(BaseException):
    """SIGTERM reached a rank: end the run KILLED, like Ctrl-C."""


def install() -> None:
    signal.signal(signal.SIGTERM, _raise_terminated)


def seen() -> bool:
    """Whether this process has received SIGTERM: it is ending, whatever error it raised since."""
    return _seen


def _raise_terminated(_signum: int, _frame: Any) -> None:
    global _seen
    _seen = True
    # Once: Slurm signals every process of the step, so a second SIGTERM (from the job's wrapper)
    # must not interrupt the recording of the first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated("terminated by SIGTERM")
