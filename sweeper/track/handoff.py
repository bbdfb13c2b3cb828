"""The runs that warm workers hand off (trainer/record/journal.py), sent by the sweeper, which has
MLflow loaded: a thread sends the running points' journals while the watch polls (so a Ctrl-C lands
in the watch, never inside SQLAlchemy), and each finished point's once more; the sweep's end
(collect.py) sends anything left."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.record import store

if TYPE_CHECKING:
    from sweeper.track.records import SweepRecord
    from sweeper.track.watch import Flight


class HandoffSender:
    """Called by the watch after every step (the points running, those ended); sends in a thread."""

    def __init__(self, record: SweepRecord, poll_s: float) -> None:
        self.record, self.poll_s = record, poll_s
        self.running: list[Path] = []
        self.ended: list[Path] = []  # points ended since the last send: their journals once more
        self.told: set[int] = set()  # the ended points already in ``ended`` once
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="handoff-sender", daemon=True)
        if store.sqlite_file(record.uri) is not None:  # only a SQLite store's runs are handed off
            self.thread.start()

    def __call__(self, flight: Flight) -> None:
        with self.lock:
            self.running = [p.dir for p, _job in flight.running.values()]
            for i in flight.finished.keys() - self.told:  # also those that started and ended between two steps
                self.told.add(i)
                if i in flight.started:
                    self.ended.append(flight.started[i].dir)

    def _run(self) -> None:
        begun = time.monotonic()
        # Every poll_s from the last look's start, not after its sends: a thread behind (a run's send
        # is ~30 ms, tiny points end faster) catches up at once instead of idling a poll between.
        while not self.stopped.wait(max(0.0, begun + self.poll_s - time.monotonic())):
            begun = time.monotonic()
            with self.lock:
                # ended first: a point's end is in the store before the run its worker began next
                folders, self.ended = [f for f in self.ended if f not in self.running] + self.running, []
            self.record.send_handed_off(folders)

    def stop(self) -> None:
        """No more sends from the thread (the sweep's end sends what is left)."""
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join()
