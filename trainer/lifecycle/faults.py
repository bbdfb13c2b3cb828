"""The fault a test or a user's drill asks for (config ``fault.*``): at one iteration of one rank,
raise, die at once by SIGKILL as the OOM killer leaves a rank, or lose a SIGTERM. ``fit`` calls
the hook before each step (trainer/core/loop.py ``before_step``)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any


class InjectedFaultError(RuntimeError):
    """Raised on purpose (config ``fault.*``) to exercise the failure path of runs and sweeps."""


def inject_fault(kind: str, rank: int, iteration: int) -> None:
    """The fault of config ``fault.*``: raise, or (kind=kill) die at once as the OOM killer leaves a
    rank, or (kind=lost_sigterm) get a SIGTERM whose exception a bare ``except:`` swallows, as
    Cython's module init did during numpy.random's import (training goes on from here)."""
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "lost_sigterm":
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)  # its handler runs here
        except BaseException:  # swallowed: what the drill is of
            pass
        return
    raise InjectedFaultError(f"fault injected on rank {rank} at iteration {iteration} (config fault.*)")


def hook(fault: Any, rank: int) -> Callable[[int], None] | None:
    """``fit``'s ``before_step`` for config ``fault`` on this rank; None where no fault is asked of it."""
    if fault.iteration is None or fault.rank != rank:
        return None

    def before_step(iteration: int) -> None:
        if iteration == fault.iteration:
            inject_fault(fault.kind.value, rank, iteration)

    return before_step
