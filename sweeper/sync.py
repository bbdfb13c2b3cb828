"""Send what points wrote while the tracking server was away (trainer/record/journal.py).

    python -m sweeper.sync [FOLDER ...]     # default: multirun/, every sweep's points

Each point's folder may hold a journal its run left when the server did not answer in time;
this sends it, in order, and ends the run as its trainer did. Sending twice is harmless. A sweep
whose end waited too (its parent's journal) gets its report once all of it is sent: the report a
sweep could not write while the server was away.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from sweeper import display
from sweeper.report import resources
from sweeper.track.records import PARENT_JOURNAL
from trainer.record import journal
from trainer.record.store import client

PARENT = f"{PARENT_JOURNAL}/{journal.FILE}"  # where a sweep journals its parent run's end (collect.py end_parent)


def sync(folders: list[Path]) -> int:
    """Send every journal under ``folders``; 0 when all are sent, 1 when one could not be or
    refused a line (an artifact outside its folder)."""
    sweeps = [(j.parent.parent, header) for f in folders for j in Path(f).rglob(PARENT) if (header := _header(j))]
    results = [r for folder in folders for r in journal.send_left(folder)]
    for path, what in results:
        display.console.print(f"{path.parent}: {what}")
    if not results:
        display.console.print(f"nothing to send under {', '.join(map(str, folders))}")
    for sweep_dir, header in sweeps:  # read before sending: a journal sent in full is removed
        if not any(sweep_dir.rglob(journal.FILE)):  # all of the sweep is in the store now
            write_report(sweep_dir, header["uri"], header["run_id"])
    return int(any(what.startswith("not sent") or "refused" in what for _, what in results))


def _header(path: Path) -> dict | None:
    """A parent's journal's header; None where it is damaged (send_left says so)."""
    try:
        return journal.Journal(path.parent).header()
    except (OSError, ValueError):
        return None


def write_report(sweep_dir: Path, uri: str, parent_id: str) -> None:
    """The sweep's report, as its own end would have written it; a failure is said, not raised."""
    from sweeper.report import report_for

    try:
        c = client(uri)
        log_totals(c, parent_id)
        report = report_for(c, [c.get_run(parent_id)], sweep_dir / "report")
    except Exception as e:  # the runs are in the store: the report can be built again later
        display.console.print(f"[red]report not written[/red] ({type(e).__name__}: {e}); python -m sweeper.report")
        return
    display.console.print(f"report of {len(report.rows)} point(s): {sweep_dir / 'report' / 'report.html'}")


def log_totals(c: Any, parent_id: str) -> None:
    """What the sweep's runs held (its GPU- or core-seconds, by nproc) on its parent, as the sweep's
    end logs them where the server answers (collect.py): from its children, now in the store."""
    from mlflow.entities import Metric

    parent = c.get_run(parent_id)
    kids = c.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'", max_results=50000
    )
    held = resources.held((int(r.data.params.get("nproc", 1)), r.data.metrics) for r in kids)
    totals = resources.parent_metrics(held)
    now = int(time.time() * 1000)
    if totals:
        c.log_batch(parent_id, metrics=[Metric(k, v, now, 0) for k, v in totals.items()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeper.sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path, default=[Path("multirun")], help="sweep or point folders")
    folders = parser.parse_args(argv).folders
    for folder in folders:  # a typo must not read as "nothing to send"
        if not folder.is_dir():
            what = "is a file, not a folder" if folder.exists() else "does not exist"
            parser.error(f"{folder} {what}: name a sweep's folder (multirun/DATE/TIME) or a point's")
    return sync(folders)


if __name__ == "__main__":
    sys.exit(main())
