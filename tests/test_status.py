"""``python -m sweeper.status`` against a sweep in progress: real ranks, a real store."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sweeper.status import file_rows, status_rows
from sweeper.track import sweep_file
from tests.conftest import sweeper_command
from tests.test_sweeper import parents
from trainer.record import store

pytestmark = pytest.mark.mpi
EPOCHS = 3000  # of 6 batches: seconds, long enough to be seen running both ways
SHORT = 3  # the other point's: it only has to end


def test_status_shows_a_running_sweeps_points_from_another_terminal(idx_dir, mlflow_uri, tmp_path):
    # One core for the sweep: its two points train one after the other, the long one long enough to be seen.
    args = [f"epochs={EPOCHS},{SHORT}", "hidden=16", "batch_size=10", "data.n_train=60", f"data.dir={idx_dir}"]
    cmd = sweeper_command([*args, "device=cpu", "launcher.cpus=1", "check.reference=false"])
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen: dict[str, dict | None] = {"store": None, "files": None}  # the rows of each way, once one runs
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None and None in seen.values():
            folder = sweep_file.find("latest", tmp_path)  # the sweep's own files: its runs are handed off
            if folder is not None and seen["files"] is None:
                seen["files"] = running({p: (s, d) for p, s, d in file_rows(folder)[1]})
            found = parents(mlflow_uri)
            if found and seen["store"] is None:
                seen["store"] = running({p: (s, d) for p, s, d in status_rows(store.client(mlflow_uri), found[0])})
            time.sleep(0.3)
        assert None not in seen.values(), proc.stdout.read() if proc.poll() is not None else f"not seen: {seen}"
        for rows in seen.values():  # a point running, with its epoch and ETA; the other waits, runs or is done
            assert set(rows) == {f"epochs={EPOCHS}", f"epochs={SHORT}"}
            assert any(s == "running" and f" of {EPOCHS}, " in d and "ETA" in d for s, d in rows.values()), rows
            assert {s for s, _d in rows.values()} <= {"queued", "running", "finished"}, rows
    finally:
        out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    # The progress line's epoch, from the tail of each point's journal.
    assert {sweep_file.epoch_done(d) for d in folder.iterdir() if (d / "point.json").exists()} == {EPOCHS, SHORT}
    # #49: from another terminal, from the sweep's own files: MLflow is never imported.
    said = "import sys; from sweeper.status import main; rc = main(['latest']); print('mlflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", said], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "finished 2  of 2" in result.stdout and "(FINISHED)" in result.stdout
    assert result.stdout.count("loss ") == 2
    assert result.stdout.splitlines()[-1] == "False", result.stdout
    # The store's answer is the same: a sweep id names it there too.
    sweep_id = sweep_file.read(folder)["sweep_id"]
    result = subprocess.run(
        [sys.executable, "-m", "sweeper.status", sweep_id, "--tracking-uri", mlflow_uri],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "finished 2  of 2" in result.stdout and result.stdout.count("loss ") == 2


def running(rows: dict[str, tuple[str, str]]) -> dict | None:
    """The rows once a point is running with its params in (its epochs known), else None."""
    return rows if any(s == "running" and f" of {EPOCHS}, " in d for s, d in rows.values()) else None


@pytest.mark.parametrize("command", ["sweeper.status", "sweeper.report"])
def test_a_folder_or_store_that_is_no_sweeps_is_said_and_nothing_is_created(command, tmp_path):
    """#47: status and report on a missing folder answered "no experiment 'sweepscale'" and left an
    empty store behind; a folder that is not a sweep's is named as such."""
    from tests.conftest import recorded_parent

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    cmd = [sys.executable, "-m", command]
    done = subprocess.run([*cmd, "/nope"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no MLflow store at" in done.stderr, done.stdout + done.stderr
    assert not (tmp_path / "mlflow.db").exists()
    recorded_parent(f"sqlite:///{tmp_path / 'mlflow.db'}", "s1", "sweep", "hidden=8")
    (tmp_path / "garbage").mkdir()
    for target, said in (("/nope", "/nope: no such folder"), ("garbage", "garbage is not the folder of a sweep")):
        done = subprocess.run([*cmd, target], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and said in done.stderr, done.stdout + done.stderr
