"""``python -m sweeper.status`` against a sweep in progress: real ranks, a real store."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sweeper.status import status_rows
from tests.test_sweeper import parents
from trainer.record import store

pytestmark = pytest.mark.mpi


def test_status_shows_a_running_sweeps_points_from_another_terminal(idx_dir, mlflow_uri, tmp_path):
    # One core for the sweep: its two points train one after the other, long enough to be seen.
    args = ["hidden=16,32", "epochs=600", "batch_size=10", "data.n_train=60", f"data.dir={idx_dir}"]
    cmd = [sys.executable, "-m", "sweeper", "-m", *args, "device=cpu", "launcher.cpus=1", "check.reference=false"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = None
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            found = parents(mlflow_uri)
            if found:
                rows = {p: (s, d) for p, s, d in status_rows(store.client(mlflow_uri), found[0])}
                if any(s == "running" and " of 600, " in d for s, d in rows.values()):  # once its params are in
                    seen = rows
                    break
            time.sleep(0.3)
        assert seen is not None, proc.stdout.read() if proc.poll() is not None else "no point seen running"
        (state, detail), other = seen["hidden=16"], seen["hidden=32"]
        if state == "finished":  # the first trained before the look: the second is the one running
            (state, detail), other = other, (state, "")
            assert other[0] == "finished"
        else:
            assert other == ("queued", "")  # one core: it waits for the first
        assert state == "running" and " of 600, " in detail and "ETA" in detail
    finally:
        out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    result = subprocess.run(
        [sys.executable, "-m", "sweeper.status", "latest"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "finished 2  of 2" in result.stdout and "(FINISHED)" in result.stdout
    assert result.stdout.count("loss ") == 2


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
