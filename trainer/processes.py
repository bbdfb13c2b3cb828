"""Processes of this host: whether one is alive, and how a process names itself ("host pid") where
others must find it (a sweep's owner, a queue's sweeper). A leaf: it imports nothing of the trainer."""

from __future__ import annotations

import os
import socket


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
