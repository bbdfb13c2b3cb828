"""The warm queue's files: how a sweeper hands points to warm workers and learns that they ended.

A queue is a folder: ``todo/<n>`` tickets (each naming a point's folder), ``claimed/<n>.<worker>``
(a ticket renamed by the worker that took it: atomic, so no point is taken twice), ``owner`` (the
sweeper filling it, "host pid") and ``sealed`` (every ticket written). A worker writes
``result.json`` in the point's folder once the point's run has ended. Standard library only: the
sweeper (sweeper/runners/warm.py) and the worker (trainer/worker.py) both speak it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from trainer.ranks.processes import alive

TODO, CLAIMED = "todo", "claimed"
SEALED = "sealed"  # every ticket is written
OWNER = "owner"  # "host pid" of the sweeper that fills the queue
SEAL_POLL_S = 0.01
POINT_DATA = "point.json"  # beside point.yaml, the config a cold job runs (sweeper/point_files.py)
RESULT = "result.json"
DATA_HINT = "SWEEPSCALE_DATA"  # the queue's data set (data_key as JSON): loaded while the sweeper records


def claim(queue: Path, name: str, served: set[Path]) -> Path | None:
    """The next point's folder, claimed for worker ``name``; None when the queue is empty. A point
    this worker claimed before it was requeued (not in ``served``, the claims of this process) and
    that has no result yet comes first: it resumes from its checkpoint."""
    for mine in sorted((queue / CLAIMED).glob(f"*.{name}")):
        point_dir = Path(mine.read_text().strip())
        if point_dir not in served and not (point_dir / RESULT).exists():
            served.add(point_dir)
            return point_dir
    for ticket in sorted((queue / TODO).iterdir()):
        try:
            os.rename(ticket, queue / CLAIMED / f"{ticket.name}.{name}")
        except FileNotFoundError:  # another worker of this queue took it first
            continue
        point_dir = Path((queue / CLAIMED / f"{ticket.name}.{name}").read_text().strip())
        served.add(point_dir)
        return point_dir
    return None


def wait_sealed(queue: Path) -> bool:
    """Block until the queue is sealed (True), or until its owner, a process on this host, is gone
    (False: the sweeper died before it wrote the tickets)."""
    try:
        host, pid = (queue / OWNER).read_text().split()
    except (OSError, ValueError):
        host, pid = "", "0"
    while not (queue / SEALED).exists():
        if host == socket.gethostname() and not alive(int(pid)):
            return False
        time.sleep(SEAL_POLL_S)
    return True


def write_result(point_dir: Path, status: int, worker: str, seconds: float) -> None:
    """What the sweeper reads to know the point ended (written last, atomically)."""
    tmp = point_dir / f".{RESULT}.tmp"
    tmp.write_text(json.dumps({"status": status, "worker": worker, "seconds": seconds}))
    os.replace(tmp, point_dir / RESULT)


def data_key(cfg: Any) -> tuple:
    """What makes two points' data sets one (a worker loads it once); the queue's DATA_HINT as JSON."""
    d = cfg.data
    return (d.dir, d.n_train, d.n_test, cfg.dtype.value, d.scale.value)
