"""Sweeps recorded through a real `mlflow server` on a real PostgreSQL (scripts/tracking_up.sh,
which .ci/run starts): the runs and the report land in PostgreSQL, and 32 points writing at
once lose nothing."""

from __future__ import annotations

import os
import subprocess
import threading
import urllib.request
import uuid

import pytest

from tests.test_sweeper import FAST, sweep
from trainer import metrics
from trainer.record import journal, store, tracking

SERVER = os.environ.get("SWEEPSCALE_TEST_SERVER", "http://127.0.0.1:5000")
DATABASE = os.environ.get("SWEEPSCALE_TEST_DATABASE", "postgresql://mlflow:mlflow@127.0.0.1:5432/mlflow")


def server_answers() -> bool:
    try:
        return urllib.request.urlopen(f"{SERVER}/health", timeout=3).status == 200
    except OSError:
        return False


pytestmark = [
    pytest.mark.mpi,
    pytest.mark.postgres,
    pytest.mark.skipif(
        not server_answers(), reason=f"no tracking server at {SERVER}: CI starts one with scripts/tracking_up.sh"
    ),
]


def in_postgres(sql: str) -> list[list[str]]:
    """Rows read from the database behind the server, with psql (not through MLflow)."""
    out = subprocess.run(["psql", DATABASE, "-AtF|", "-c", sql], capture_output=True, text=True, check=True)
    return [line.split("|") for line in out.stdout.splitlines()]


def test_a_sweep_and_its_report_land_in_postgresql(tmp_path):
    experiment = f"pg-{uuid.uuid4().hex[:8]}"
    args = ["hidden=8,16", *FAST, f"mlflow.tracking_uri={SERVER}", f"mlflow.experiment={experiment}"]
    result = sweep(args, tmp_path, figures=True)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = in_postgres(
        "select r.name, r.status from runs r join experiments e on r.experiment_id = e.experiment_id "
        f"where e.name = '{experiment}' order by r.name"
    )
    parent_name = (
        "sweep hidden · epochs=2 · batch_size=50 · data.n_train=200 · data.n_test=50 · perf.min_batches=1"
        " · perf.min_seconds=0 · data embedded digits"
    )
    assert rows == [["hidden=16", "FINISHED"], ["hidden=8", "FINISHED"], [parent_name, "FINISHED"]]
    summary = in_postgres(
        "select count(*) from metrics m join runs r on m.run_uuid = r.run_uuid join experiments e "
        f"on r.experiment_id = e.experiment_id where e.name = '{experiment}' and m.key like 'study/%'"
    )
    assert int(summary[0][0]) > 0  # the report's figures, on the parent run
    client = store.client(SERVER)
    (parent,) = client.search_runs(
        [client.get_experiment_by_name(experiment).experiment_id], "tags.`mlflow.parentRunId` IS NULL"
    )
    assert "report.html" in {a.path.split("/")[-1] for a in client.list_artifacts(parent.info.run_id, "report")}
    assert not list(tmp_path.rglob("journal.jsonl"))  # every point's writes reached the server


def test_32_points_writing_at_once_lose_nothing(tmp_path, monkeypatch):
    """32 runs recorded at once through their journals (as 32 points of a sweep would): every
    metric of every run is in the store once, and every run ended."""
    monkeypatch.setattr(journal, "DRAIN_S", 240)  # 32 runs' ends on a loaded 2-core machine: let them drain
    experiment = f"pg32-{uuid.uuid4().hex[:8]}"
    epochs, steps = 20, 25

    def point(i: int) -> None:
        recorder = tracking.Recorder(SERVER, experiment, f"point-{i}", {}, spool=str(tmp_path / f"p{i}"))
        for epoch in range(1, epochs + 1):
            for s in range(steps):
                recorder.metric(metrics.TRAIN_LOSS, 1.0 / (1 + epoch * steps + s), (epoch - 1) * steps + s)
            recorder.metric(metrics.TRAIN_LOSS_EPOCH, 1.0 / epoch, epoch)
            recorder.flush()
        recorder.finish("FINISHED")

    threads = [threading.Thread(target=point, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    rows = in_postgres(
        "select r.status, count(m.key) from runs r join experiments e on r.experiment_id = e.experiment_id "
        f"left join metrics m on m.run_uuid = r.run_uuid where e.name = '{experiment}' group by r.run_uuid, r.status"
    )
    assert len(rows) == 32
    assert all(row == ["FINISHED", str(epochs * steps + epochs)] for row in rows), rows
    assert not list(tmp_path.rglob("journal.jsonl"))


def test_a_search_keeps_its_study_in_postgresql(tmp_path):
    # The study in the same PostgreSQL as the runs, in a schema of its own (both keep an alembic_version).
    experiment, schema = f"pg-{uuid.uuid4().hex[:8]}", f"optuna_{uuid.uuid4().hex[:8]}"
    in_postgres(f"create schema {schema}")
    storage = DATABASE.replace("postgresql://", "postgresql+psycopg2://") + f"?options=-csearch_path%3D{schema}"
    args = ["hydra/sweeper=search", "lr=tag(log,interval(0.01,1))", "hydra.sweeper.n_trials=3", *FAST]
    tracking = [
        f"mlflow.tracking_uri={SERVER}",
        f"mlflow.experiment={experiment}",
        f"hydra.sweeper.storage='{storage}'",
    ]
    try:
        result = sweep([*args, *tracking], tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert in_postgres(f"select state from {schema}.trials order by number") == [["COMPLETE"]] * 3
        runs = in_postgres(
            "select r.status, count(*) from runs r join experiments e on r.experiment_id = e.experiment_id "
            f"where e.name = '{experiment}' group by r.status"
        )
        assert runs == [["FINISHED", "4"]]  # three trials and their parent
        best = in_postgres(f"select max(value) from {schema}.trial_values")[0][0]
        assert f"best test/precision={float(best):.4g}" in result.stdout
    finally:
        in_postgres(f"drop schema {schema} cascade")
