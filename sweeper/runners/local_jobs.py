"""submitit's local jobs, each started in a session of its own.

A terminal's Ctrl-C goes to its whole foreground process group: with submitit's own executor
that is the sweeper, every job's controller and every trainer. Each of those then ended on its
own, and the controllers printed their KeyboardInterrupt (2-4 tracebacks over the sweep's one
line). In sessions of their own the jobs hear nothing from the terminal: the sweeper alone gets
the Ctrl-C, and ends them as it ends them on SIGTERM (sweeper/track/watch.py: SIGTERM to each job, its
runs end KILLED). Detached, they must still end with the sweeper: on Linux each controller asks
the kernel for a SIGTERM when the sweeper dies (a SIGKILL, a closed login), which it passes to its
trainer, whose run then ends KILLED; a later sweep would otherwise run the point beside it.
submitit starts the controller (its env is submitit's contract, not ours): only the Popen it calls
is given ``start_new_session`` and that request, and only while this executor submits.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import submitit
from submitit.local import local as submitit_local


class LocalExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor, its jobs detached from the sweeper's terminal."""

    def _submit_command(self, command: str) -> Any:
        with _own_sessions(str(self.folder)):
            return super()._submit_command(command)


PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent thread ends
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None  # resolved here, not in the child
_SWEEPER = os.getpid()


def _start_controller(folder: str) -> None:
    """In the child, before submitit's controller starts: its job's folder made, and SIGTERM when the
    sweeper is gone. submitit makes the folder (named by the controller's pid) once the controller
    has started; on a busy machine the controller, opening its logs there first, failed ("No such
    file or directory: .../<pid>_0_log.out") and no task started."""
    with contextlib.suppress(OSError):  # a full disk: the controller says so itself
        os.makedirs(folder.replace("%j", str(os.getpid())), exist_ok=True)
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != _SWEEPER:  # it died before the request: no signal will come
            os._exit(1)


@contextlib.contextmanager
def _own_sessions(folder: str) -> Iterator[None]:
    module = submitit_local.subprocess
    before = functools.partial(_start_controller, folder)
    popen = functools.partial(subprocess.Popen, start_new_session=True, preexec_fn=before)
    submitit_local.subprocess = SimpleNamespace(Popen=popen)
    try:
        yield
    finally:
        submitit_local.subprocess = module
