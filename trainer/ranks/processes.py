"""Processes of this host: whether one is alive, how a process names itself ("host pid") where
others must find it (a sweep's owner, a queue's sweeper), and how ours exit. A leaf: it imports
nothing of the trainer."""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that number: alive
        pass
    return True


def owner() -> str:
    """This process, on this host: what a sweeper writes as a queue's OWNER and as its runs' tag."""
    return f"{socket.gethostname()} {os.getpid()}"


def exit_now(code: object = 0) -> NoReturn:
    """End this process as Python would (other threads joined, atexit handlers run, MPI finalized,
    output flushed) but without its teardown of every module: after MLflow, SQLAlchemy and
    matplotlib that teardown alone takes 0.5-1.3 s (docs/benchmarks.md). ``code`` as SystemExit's."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
    status = code if isinstance(code, int) else 0 if code is None else 1
    threading._shutdown()  # as the interpreter's exit: the pools' hooks told to end, then their threads joined
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")  # mpi4py finalizes in Py_AtExit, which os._exit skips
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(status)


def run_then_exit(main: Callable[[], object]) -> NoReturn:
    """``main()``, then :func:`exit_now` with its SystemExit's code, or its result where it returned."""
    try:
        result = main()
    except SystemExit as e:
        exit_now(e.code)
    exit_now(result)
