"""A real `mlflow server` killed in the middle of a run and started again: training never waits on
it, and the journal (trainer/journal.py) loses nothing and sends nothing twice."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_trainer_runs import COMMON
from trainer import journal, metrics

pytestmark = pytest.mark.mpi


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(folder: Path, port: int) -> subprocess.Popen:
    """`mlflow server` on loopback, its runs in SQLite and its artifacts served by itself."""
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    cmd += ["--backend-store-uri", f"sqlite:///{folder / 'server.db'}", "--artifacts-destination", str(folder / "art")]
    log = open(folder / "server.log", "a")  # noqa: SIM115 (the server's lifetime, not a block's)
    server = subprocess.Popen(cmd, cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return server
        except OSError:
            time.sleep(0.3)
    stop(server)
    raise AssertionError(f"mlflow server did not start: {(folder / 'server.log').read_text()[-2000:]}")


def stop(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGKILL)  # the server and its workers, at once: an outage, not a shutdown
    server.wait()


def test_a_server_killed_mid_run_loses_nothing(idx_dir, tmp_path):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    spool = tmp_path / "point"
    args = [*COMMON, "epochs=100", f"data.dir={idx_dir}", f"mlflow.tracking_uri={uri}", f"mlflow.spool_dir={spool}"]
    env = {**os.environ, "SWEEPSCALE_SPOOL_DRAIN_S": "1"}
    cmd = [sys.executable, "-m", "trainer", *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (spool / journal.SENT).exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None  # still training
        stop(server)  # mid-run: some epochs sent, the rest not
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err  # trained, checked and ended without the server
    assert "python -m sweeper.sync" in err and (spool / journal.FILE).exists()

    server = start_server(tmp_path, port)
    try:
        sync = subprocess.run([sys.executable, "-m", "sweeper.sync", str(spool)], capture_output=True, text=True)
        assert sync.returncode == 0 and "sent" in sync.stdout, sync.stdout + sync.stderr
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("sweepscale").experiment_id])
        assert run.info.status == "FINISHED"
        for key, expected in ((metrics.TRAIN_LOSS, range(100 * 9)), (metrics.TRAIN_LOSS_EPOCH, range(1, 101))):
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
            assert steps == list(expected), key  # every value once
        assert run.data.metrics[metrics.weight_error("max")] < 1e-12  # the check after training landed too
        assert "weights_final.npz" in {a.path for a in client.list_artifacts(run.info.run_id)}
        assert not (spool / journal.FILE).exists()  # all sent: nothing left to send
    finally:
        stop(server)
