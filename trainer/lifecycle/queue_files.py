"""The warm queue's files: how a sweeper hands points to warm workers and learns that they ended.

A queue is a folder: ``todo/<n>`` tickets (each naming a point's folder), ``claimed/<n>.<worker>``
(a ticket renamed by the worker that took it: atomic, so no point is taken twice), ``owner`` (the
sweeper filling it, "host pid") and ``sealed`` (every ticket written). A grid's tickets are all
written before its seal; a search's queue says ``streaming``: its tickets come one by one while
its workers train (sweeper/search/study.py), until the seal. A worker writes ``result.json`` in the
point's folder once the point's run has ended and its check landed (``trained`` before, once
its training ended). Standard library only: the
sweeper (sweeper/runners/warm.py) and the worker (trainer/worker.py) both speak it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.ranks.processes import alive

TODO, CLAIMED = "todo", "claimed"
SEALED = "sealed"  # every ticket is written
STREAMING = "streaming"  # tickets come while the workers train, until the seal
OWNER = "owner"  # "host pid" of the sweeper that fills the queue
RELEASED = "released"  # released/<worker name>: an idle worker of a search's queue is to end (its allocation freed)
SEAL_POLL_S = 0.01
POINT_DATA = "point.json"  # beside point.yaml, the config a cold job runs (sweeper/plan/point_files.py)
RESULT = "result.json"
TRAINED = "trained"  # the point's run ended with its training; its CPU check may still compute (a search tells it)
DATA_HINT = "SWEEPSCALE_DATA"  # the queue's data set (data_key as JSON): loaded while the sweeper records
AHEAD = "ahead"  # a grid's first points' configs (<n>.json), written at the queue's opening, before the tickets


def write_ahead(queue: Path, index: int, values: dict[str, Any]) -> None:
    """A point's config, before its ticket (and before the sweep's store is set up): a GPU worker
    starts its CPU reference from it as soon as its data set is loaded (trainer/worker.py)."""
    folder = queue / AHEAD
    folder.mkdir(exist_ok=True)
    tmp = folder / f".{index}.tmp"
    tmp.write_text(json.dumps(values))
    os.replace(tmp, folder / f"{index}.json")


def write_ticket(queue: Path, index: int, point_dir: Path) -> None:
    """Ticket ``index`` for the point in ``point_dir``, whole when it appears (a worker may claim
    and read it at once: a search's queue is watched while its tickets are written)."""
    part = queue / f".{index:06d}.part"
    part.write_text(str(point_dir))
    os.replace(part, queue / TODO / f"{index:06d}")


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
    """Block until the queue is sealed or streaming (True), or until its owner, a process on this
    host, is gone (False: the sweeper died before it wrote the tickets)."""
    return wait_for(queue, lambda: (queue / SEALED).exists() or (queue / STREAMING).exists())


def wait_ticket(queue: Path, meanwhile: Callable[[], None] = lambda: None, name: str = "") -> bool:
    """Block until the queue holds a ticket (True) or is sealed (True: the worker ends once it is
    empty), or its owner is gone or has released worker ``name`` (False); ``meanwhile`` runs at every
    look (a worker's checks land)."""

    def ready() -> bool:
        meanwhile()
        return (queue / SEALED).exists() or any((queue / TODO).iterdir()) or released(queue, name)

    return wait_for(queue, ready) and not released(queue, name)


def release(queue: Path, name: str) -> None:
    """Worker ``name``, waiting for a ticket with none in hand, is to end (the sweeper wants its
    allocation for another shape's trials)."""
    (queue / RELEASED).mkdir(exist_ok=True)
    (queue / RELEASED / name).touch()


def released(queue: Path, name: str) -> bool:
    return bool(name) and (queue / RELEASED / name).exists()


def wait_for(queue: Path, ready: Callable[[], bool]) -> bool:
    """Poll ``ready`` until it holds (True) or the queue's owner, a process on this host, is gone (False)."""
    try:
        host, pid = (queue / OWNER).read_text().split()
    except (OSError, ValueError):
        host, pid = "", "0"
    while not ready():
        if host == socket.gethostname() and not alive(int(pid)):
            return False
        time.sleep(SEAL_POLL_S)
    return True


def sealed(queue: Path) -> bool:
    return (queue / SEALED).exists()


def streaming(queue: Path) -> bool:
    """Whether the queue's tickets come while its workers train (a search's queue)."""
    return (queue / STREAMING).exists()


def write_result(point_dir: Path, status: int, worker: str, seconds: float) -> None:
    """What the sweeper reads to know the point ended (written last, atomically)."""
    tmp = point_dir / f".{RESULT}.tmp"
    tmp.write_text(json.dumps({"status": status, "worker": worker, "seconds": seconds}))
    os.replace(tmp, point_dir / RESULT)


def failed_claims(queue: Path, name: str) -> list[str]:
    """The folders' names of the points worker ``name`` claimed whose result says they failed (a
    status other than 0): its job body ends the job failed for them, so that Slurm's accounting agrees."""
    failed = []
    for mine in sorted((queue / CLAIMED).glob(f"*.{name}")):
        point_dir = Path(mine.read_text().strip())
        try:
            status = json.loads((point_dir / RESULT).read_text())["status"]
        except (OSError, ValueError, KeyError):
            continue  # no result: the worker ended without it, which its own status says
        if status:
            failed.append(point_dir.name)
    return failed


def write_trained(point_dir: Path) -> None:
    """The point's run has ended its training (its metrics are in the store): a search needs no more."""
    (point_dir / TRAINED).touch()


def data_key(cfg: Any) -> tuple:
    """What makes two points' data sets one (a worker loads it once); the queue's DATA_HINT as JSON."""
    d = cfg.data
    return (d.dir, d.n_train, d.n_test, cfg.dtype.value, d.scale.value)
