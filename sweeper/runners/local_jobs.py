"""submitit's local jobs, each started in a session of its own.

A terminal's Ctrl-C goes to its whole foreground process group: with submitit's own executor
that is the sweeper, every job's controller and every trainer. Each of those then ended on its
own, and the controllers printed their KeyboardInterrupt (2-4 tracebacks over the sweep's one
line). In sessions of their own the jobs hear nothing from the terminal: the sweeper alone gets
the Ctrl-C, and ends them as it ends them on SIGTERM (sweeper/watch.py: SIGTERM to each job, its
runs end KILLED). submitit starts the controller (its env is submitit's contract, not ours):
only the Popen it calls is given ``start_new_session``, and only while this executor submits.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import submitit
from submitit.local import local as submitit_local


class LocalExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor, its jobs detached from the sweeper's terminal."""

    def _submit_command(self, command: str) -> Any:
        with _own_sessions():
            return super()._submit_command(command)


@contextlib.contextmanager
def _own_sessions() -> Iterator[None]:
    module = submitit_local.subprocess
    submitit_local.subprocess = SimpleNamespace(Popen=functools.partial(subprocess.Popen, start_new_session=True))
    try:
        yield
    finally:
        submitit_local.subprocess = module
