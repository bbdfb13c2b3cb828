"""The report's figures drawn while the last CPU checks land. Once every point of a grid has trained
(the warm workers' ``trained`` marker: its run ended, its check may still compute), a thread builds
the report from the store as it is then, its figures in the drawing children. The sweep's own
report, once the checks have landed, draws again only what they changed, the weight error: a
figure asked again with equal inputs is not redrawn (sweeper/report/drawing.py), and every figure
but the weight error's reads the points without their check (study.Point.without_check). A check
of a few steps lands within CHECKS_GRACE_S of its training: waited for, the weight error too is
drawn once (redrawn after the others, it was 0.3 s at the end of the headline's sweep)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sweeper.report import drawing
from sweeper.timeline import phase
from trainer.lifecycle import queue_files

if TYPE_CHECKING:
    from sweeper.records import SweepRecord
    from sweeper.watch import Flight

CHECKS_GRACE_S = 1.0  # how long the figures wait for checks still computing once every point trained


class EarlyReport:
    """Called by the watch after every step; builds once, in a thread, when only checks are left."""

    def __init__(self, record: SweepRecord, folder: Path, target: float | None) -> None:
        self.record, self.folder, self.target = record, folder, target
        self.thread: threading.Thread | None = None

    def __call__(self, flight: Flight) -> None:
        if self.thread is not None or flight.queued or not flight.running:
            return
        if all((p.dir / queue_files.TRAINED).exists() for p, _job in flight.running.values()):
            folders = [p.dir for p in flight.started.values()]  # every run, whole: the figures its report reuses
            self.thread = threading.Thread(target=self._build, args=(folders,), name="early-report", daemon=True)
            self.thread.start()

    def _build(self, folders: list[Path]) -> None:
        until = time.monotonic() + CHECKS_GRACE_S
        while time.monotonic() < until and not all((f / queue_files.RESULT).exists() for f in folders):
            time.sleep(0.02)  # a point's result is written once its check has landed
        with phase("report: figures while the checks land"):
            try:
                drawing.imported()
                drawing.remember()
                from sweeper.report import report_for

                self.record.send_handed_off(folders, budget_s=None)  # their training in the store before it is read
                parent = self.record.client.get_run(self.record.parent_id)
                report_for(self.record.client, [parent], self.folder, attach=False, target=self.target)
            except Exception:  # the sweep's own report says what is wrong
                pass

    def wait(self) -> None:
        """Before the sweep's own report: it reuses what this one drew (and pyplot draws in one thread)."""
        if self.thread is not None:
            self.thread.join()
