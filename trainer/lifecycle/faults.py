"""The fault a test or a user's drill asks for (config ``fault.*``): at one iteration of one rank,
raise, or die at once by SIGKILL as the OOM killer leaves a rank. ``fit`` calls the hook before
each step (trainer/core/loop.py ``before_step``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any


class InjectedFaultError(RuntimeError):
    """Raised on purpose (config ``fault.*``) to exercise the failure path of runs and sweeps."""


def inject_fault(kind: str, rank: int, iteration: int) -> None:
    """The fault of config ``fault.*``: raise, or (kind=kill) die at once as the OOM killer leaves a rank."""
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFaultError(f"fault injected on rank {rank} at iteration {iteration} (config fault.*)")


def hook(fault: Any, rank: int) -> Callable[[int], None] | None:
    """``fit``'s ``before_step`` for config ``fault`` on this rank; None where no fault is asked of it."""
    if fault.iteration is None or fault.rank != rank:
        return None

    def before_step(iteration: int) -> None:
        if iteration == fault.iteration:
            inject_fault(fault.kind.value, rank, iteration)

    return before_step
