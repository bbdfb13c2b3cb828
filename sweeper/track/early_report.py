"""The report's figures drawn while the last CPU checks land. Once every point of a grid has trained
(the warm workers' ``trained`` marker: its run ended, its check may still compute), a thread builds
the report from the store as it is then, its figures in the drawing children; the weight error's
figure, the one a check changes, waits for the checks. Once they have landed, a second thread draws
it, while the others may still be drawing (after them it was the last 0.3 s of the headline's
sweep). The sweep's own report then draws nothing again: a figure asked again with equal inputs is
not redrawn (sweeper/report/drawing.py), and every figure but the weight error's reads the points
without their check (study.Point.without_check)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.report import drawing
from sweeper.timeline import phase
from trainer.lifecycle import queue_files

if TYPE_CHECKING:
    from sweeper.track.records import SweepRecord
    from sweeper.track.watch import Flight

CHECKS_POLL_S = 0.02  # how often the checks' thread looks for the points' results


class EarlyReport:
    """Called by the watch after every step; builds once, in a thread, when only checks are left."""

    def __init__(self, record: SweepRecord, folder: Path, target: float | None) -> None:
        self.record, self.folder, self.target = record, folder, target
        self.threads: list[threading.Thread] = []
        self.ending = threading.Event()  # the sweep's own report is next: the checks' thread stops waiting

    def __call__(self, flight: Flight) -> None:
        if self.threads or flight.queued or not flight.running:
            return
        if all((p.dir / queue_files.TRAINED).exists() for p, _job in flight.running.values()):
            folders = [p.dir for p in flight.started.values()]  # every run, whole: the figures its report reuses
            checked = _checked(folders)
            drawing.remember()
            self._start(self._build, folders, checked, name="early-report")
            if not checked:
                self._start(self._checks, folders, name="early-report-checks")

    def _start(self, target: Callable[..., None], *args: object, name: str) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _build(self, folders: list[Path], checked: bool) -> None:
        with phase("report: figures while the checks land"):
            try:
                parent = self._sent(folders)
                from sweeper.report import report_for

                report_for(self.record.client, [parent], self.folder, attach=False, target=self.target, checks=checked)
            except Exception:  # the sweep's own report says what is wrong
                pass

    def _checks(self, folders: list[Path]) -> None:
        """The weight error's figure, drawn once every point's check has landed (its result written)."""
        while not _checked(folders):
            if self.ending.wait(CHECKS_POLL_S) and not _checked(folders):
                return  # a check that never landed: the sweep's own report says so
        with phase("report: the weight error once the checks landed"):
            try:
                parent = self._sent(folders)
                from sweeper.report import publish, study

                drawn = publish.draw_checks(study.load(self.record.client, [parent]), self.folder)
                if drawn is not None:
                    drawn.result()
            except Exception:
                pass

    def _sent(self, folders: list[Path]) -> Any:
        """The runs sent whole (what their workers wrote so far) and the parent, read back: the store
        as the report will read it."""
        drawing.imported()
        self.record.send_handed_off(folders, budget_s=None)
        return self.record.client.get_run(self.record.parent_id)

    def wait(self) -> None:
        """Before the sweep's own report: it reuses what these drew (and pyplot draws in one thread)."""
        self.ending.set()
        for thread in self.threads:
            thread.join()


def _checked(folders: list[Path]) -> bool:
    """Every point's check landed: a point's result is written once its check has (or has failed)."""
    return all((f / queue_files.RESULT).exists() for f in folders)
