"""The report of a sweep whose tracking server was away at its end, built from what its points
wrote locally: each point's journal (trainer/record/journal.py: every write of its run, sent or
not, and what the run was created with) is replayed into a SQLite store in the report's folder,
beside a copy of the parent run, and the usual report is built from it. `python -m sweeper.sync`
later sends the same writes to the server and builds the report again from there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sweeper.points import POINTS_ARTIFACT
from sweeper.track import sweep_file
from sweeper.track.records import SweepRecord
from trainer.record import journal, store

STORE = "offline/mlflow.db"  # in the sweep's folder (its artifacts beside it, in offline/mlruns)


def write(record: SweepRecord, sweep_dir: Path, status: str, target: float | None = None) -> Any:
    """The report from the points' journals; the parent as the sweep started it, ended ``status``."""
    from sweeper.report import report_for

    folder, db = sweep_dir / "report", sweep_dir / STORE
    db.parent.mkdir(parents=True, exist_ok=True)
    db.unlink(missing_ok=True)  # a report of this sweep's end only
    uri = f"sqlite:///{db}"
    client = store.client(uri)
    experiment = store.ensure_experiment(client, uri, record.experiment)
    name, tags, params, planned = record.started
    parent = client.create_run(experiment, run_name=name, tags=tags).info.run_id
    for key, value in params.items():
        client.log_param(parent, key, value)
    client.log_dict(parent, planned, POINTS_ARTIFACT)
    for lines in journals(sweep_dir).values():
        replay(client, experiment, parent, lines)
    client.set_terminated(parent, status)
    return report_for(client, [client.get_run(parent)], folder, attach=False, target=target)


def journals(sweep_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each run's journal lines by run id, the sent part first; runs whose journal does not say
    how they were created (a parent's end, an older journal) are left out."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted([*sweep_dir.rglob(journal.DONE), *sweep_dir.rglob(journal.FILE)], key=_sent_first):
        run_id = None
        for entry in sweep_file.lines(path):
            if entry["op"] == "run":  # a handed-off run's id is its first sender's (journal.RUN)
                run_id = entry["run_id"] or _created(path.parent)
                runs.setdefault(run_id, [])
            if run_id is not None:
                runs[run_id].append(entry)
    return {run_id: lines for run_id, lines in runs.items() if "name" in lines[0]}


def _created(folder: Path) -> str:
    return (folder / journal.RUN).read_text() if (folder / journal.RUN).exists() else str(folder)


def _sent_first(path: Path) -> tuple[str, int]:
    return str(path.parent), path.name != journal.DONE


def replay(client: Any, experiment: str, parent: str, lines: list[dict[str, Any]]) -> None:
    """One point's run in the offline store: created as it was, then every write but artifacts."""
    head = lines[0]
    tags = {**head["tags"], "mlflow.parentRunId": parent}
    run = client.create_run(experiment, run_name=head["name"], tags=tags, start_time=head["start_ms"])
    for entry in lines[1:]:
        if entry["op"] not in ("run", "artifact"):  # the weights are not the report's
            journal.apply(client, run.info.run_id, entry, Path())
