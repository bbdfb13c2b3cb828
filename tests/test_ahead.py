"""A grid's points started before its store is open (sweeper/track/ahead.py): into a new SQLite store
their tickets go out before MLflow is imported, and each run still nests under the sweep's
parent; into a store that exists the store decides first. Real stores, workers and ranks."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sweeper.track.ahead import write_parent
from tests.conftest import sweeper_command
from tests.test_handoff import held_mlflow
from tests.test_sweeper import FAST, children_of, parents, runs, sweep
from trainer import metrics
from trainer.lifecycle import queue_files
from trainer.record import journal, store, tracking

pytestmark = pytest.mark.mpi


def claimed(tmp_path: Path) -> list[Path]:
    return list(tmp_path.glob(f"multirun/*/*/.submitit/queues/*/{queue_files.CLAIMED}/*"))


def point_configs(tmp_path: Path) -> dict[str, dict]:
    found = {}
    for path in tmp_path.glob(f"multirun/*/*/*/{queue_files.POINT_DATA}"):
        values = json.loads(path.read_text())
        found[values["mlflow"]["run_name"]] = values
    return found


def test_a_grid_into_a_new_store_trains_before_its_parent_exists_and_nests_under_it(tmp_path, mlflow_uri):
    """The sweeper's MLflow import held until both points have trained: their tickets went out
    before it began (one GIL: MLflow's import, seconds, beside Hydra's composition slowed the planning
    the workers wait for) and their configs name no parent; once the parent exists every run nests
    under it, FINISHED with its check. The next sweep, into the store that now exists, records its
    parent first and its points' configs name it."""
    env, release = held_mlflow(tmp_path, "sweeper/__main__.py")
    proc = subprocess.Popen(
        sweeper_command(["hidden=16,24", "nproc=1", *FAST, "launcher.cpus=1"]),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and len(list(tmp_path.glob(f"multirun/*/*/*/{queue_files.TRAINED}"))) < 2:
        time.sleep(0.1)
    trained = len(list(tmp_path.glob(f"multirun/*/*/*/{queue_files.TRAINED}")))
    release.touch()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert trained == 2, out  # both trained while the sweeper could not have created a run
    (parent,) = parents(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id)
    assert sorted(kids) == ["hidden=16", "hidden=24"] and len(runs(mlflow_uri)) == 3
    for r in kids.values():
        assert r.info.status == "FINISHED" and r.data.tags[metrics.TAG_CHECK] == "done"
        assert r.data.metrics[metrics.weight_error("max")] < 1e-4 and metrics.TEST_PRECISION in r.data.metrics
    assert all(v["mlflow"]["parent_run_id"] is None for v in point_configs(tmp_path).values())
    assert all(t.stat().st_mtime < parent.info.start_time / 1000 for t in claimed(tmp_path))
    began = Path(f"{release}.asked").stat().st_mtime  # the sweeper's MLflow import, asked for
    assert max(t.stat().st_mtime for t in claimed(tmp_path)) <= began + 0.01  # a file's time: the kernel's coarse clock

    again = sweep(["hidden=32,40", "nproc=1", *FAST, "launcher.cpus=1"], tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    (second,) = [p for p in parents(mlflow_uri) if p.info.run_id != parent.info.run_id]
    later = children_of(mlflow_uri, second.info.run_id)
    assert sorted(later) == ["hidden=32", "hidden=40"] and {r.info.status for r in later.values()} == {"FINISHED"}
    configs = point_configs(tmp_path)
    assert (
        configs["hidden=32"]["mlflow"]["parent_run_id"]
        == second.info.run_id
        == configs["hidden=40"]["mlflow"]["parent_run_id"]
    )
    newest = max(claimed(tmp_path), key=lambda t: t.stat().st_mtime)
    assert newest.stat().st_mtime > second.info.start_time / 1000
    assert {r.info.status for r in runs(mlflow_uri)} == {"FINISHED"} and len(runs(mlflow_uri)) == 6


def test_a_handed_off_run_told_its_parent_after_it_started_nests_under_it(mlflow_uri, tmp_path):
    """A run journaled with no parent, told it once the parent exists: created under it, by the
    sweeper's send and by a worker's own (its sweeper gone) alike."""
    client = store.client(mlflow_uri)
    exp = store.ensure_experiment(client, mlflow_uri, "e")
    parent = client.create_run(exp, run_name="sweep").info.run_id
    for folder, send in ((tmp_path / "0", "sweeper"), (tmp_path / "1", "worker")):
        folder.mkdir()
        recorder = tracking.Recorder(
            mlflow_uri, "e", folder.name, dict, lambda r: None, background=True, handoff=str(folder)
        )
        recorder.metric(metrics.TRAIN_LOSS, 0.5, 0)
        recorder.finish("FINISHED")
        write_parent(folder, parent)
        if send == "sweeper":
            assert journal.Journal(folder).send(client)
        else:
            assert [what for _, what in journal.send_left(folder)] == ["sent"]
        run = client.get_run((folder / journal.RUN).read_text())
        assert run.data.tags[metrics.TAG_PARENT] == parent, send
        assert run.info.status == "FINISHED" and run.data.metrics[metrics.TRAIN_LOSS] == 0.5


def test_ctrl_c_while_points_train_ahead_of_the_store_leaves_no_run_open(tmp_path, mlflow_uri):
    """A Ctrl-C once a worker has claimed a point, the sweeper still in its MLflow import: the sweep
    ends 130, its workers end their points KILLED and send their runs themselves; nothing is left
    RUNNING or unsent, no point has two runs."""
    # Never released: the sweeper has no MLflow when the Ctrl-C comes.
    env, _release = held_mlflow(tmp_path, "sweeper/__main__.py")
    cmd = sweeper_command(["hidden=8,16", "nproc=1", "epochs=100000", "data.n_train=200"])
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob(f"multirun/*/*/*/{journal.FILE}")):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in out, out
    assert "interrupted: the sweep's workers end their points" in out, out
    assert "sweep summary" in out and "│ hidden=8 " in out and "│ hidden=16 " in out, out  # #47: the closing table
    deadline = time.time() + 90  # the workers end their points, then send them: their sweeper is gone
    while time.time() < deadline and list(tmp_path.glob(f"multirun/*/*/*/{journal.FILE}")):
        time.sleep(0.2)
    assert not list(tmp_path.glob(f"multirun/*/*/*/{journal.FILE}")), "a journal was left unsent"
    found = runs(mlflow_uri)
    names = [r.info.run_name for r in found]
    assert found and len(names) == len(set(names)) and set(names) <= {"hidden=8", "hidden=16"}, names
    assert {r.info.status for r in found} == {"KILLED"}, [(r.info.run_name, r.info.status) for r in found]
    journaled = {}  # run id -> the metric keys its journal held: every one of them is in the store
    for done in tmp_path.glob(f"multirun/*/*/*/{journal.DONE}"):
        lines = [json.loads(line) for line in done.read_text().splitlines()]
        keys = {m[0] for line in lines if line["op"] == "metrics" for m in line["metrics"]}
        journaled[(done.parent / journal.RUN).read_text()] = keys
    assert set(journaled) == {r.info.run_id for r in found}
    for r in found:  # no parent was ever created; what each point trained is there
        assert metrics.TAG_PARENT not in r.data.tags and journaled[r.info.run_id] <= set(r.data.metrics)
