"""A real `mlflow server` killed in the middle of a run and started again: training never waits on
it, and the journal (trainer/record/journal.py) loses nothing and sends nothing twice."""

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

from tests.conftest import sweeper_command
from tests.test_trainer_runs import COMMON
from trainer import metrics
from trainer.record import journal

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
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # as scripts/tracking_up.sh runs it
    server = subprocess.Popen(cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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


def test_a_server_gone_at_a_sweeps_end_costs_a_bounded_wait_and_sync_delivers_everything(idx_dir, tmp_path):
    """#33 item 1: the server killed while a 2-point sweep trains. The sweep ends in bounded time
    (sweep.store_wait_s per call) with its table and one line saying what waits and the command
    that sends it, and its report from what the points journaled; after the server is back,
    `sweeper.sync` ends every run and the parent, and writes the report again from the server."""
    from trainer.record.store import client

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    args = ["hidden=8,16", "epochs=300", "batch_size=10", "data.n_train=60", "data.n_test=10", "device=cpu"]
    args += [f"data.dir={idx_dir}", f"mlflow.tracking_uri={uri}", "sweep.store_wait_s=2", "check.reference=false"]
    env = {**os.environ, "SWEEPSCALE_SPOOL_DRAIN_S": "1"}
    cmd = sweeper_command(args)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:  # both runs created: then the outage
            exp = client(uri).get_experiment_by_name("sweepscale")
            if exp is not None and len(client(uri).search_runs([exp.experiment_id])) == 3:
                break
            time.sleep(0.3)
        stop(server)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=300)
        waited = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    assert waited < 90, out  # MLflow's own retries would wait about 4 minutes per call
    assert "sweep summary" in out and out.count("FINISHED") >= 2
    assert f"the tracking server at {uri} did not answer" in out and "python -m sweeper.sync" in out
    (sweep_dir,) = tmp_path.glob("multirun/*/*")
    # The report all the same, from what the points journaled (the server is still down).
    offline = (sweep_dir / "report" / "points.csv").read_text()
    assert "hidden=8" in offline and "hidden=16" in offline and offline.count("FINISHED") == 2, offline
    assert (sweep_dir / "report" / "report.html").exists() and "report (" in out
    server = start_server(tmp_path, port)
    try:
        sync = subprocess.run(
            [sys.executable, "-m", "sweeper.sync", str(sweep_dir)], capture_output=True, text=True, timeout=240
        )
        assert sync.returncode == 0, sync.stdout + sync.stderr
        c = client(uri)
        runs = c.search_runs([c.get_experiment_by_name("sweepscale").experiment_id])
        assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3  # both points and the parent
        for r in runs:
            if "mlflow.parentRunId" in r.data.tags:  # every epoch of every point, once
                steps = [m.step for m in c.get_metric_history(r.info.run_id, metrics.TRAIN_LOSS_EPOCH)]
                assert sorted(steps) == list(range(1, 301)), r.info.run_name
        assert not list(sweep_dir.rglob(journal.FILE))  # all sent
        (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        held = parent.data.metrics  # #47: the sweep's totals, which its end could not log, logged by sync
        assert held[metrics.device_seconds("cpu")] > 0 and f"{metrics.device_seconds('cpu')}_nproc1" in held, held
        assert "report of 2 point(s)" in sync.stdout, sync.stdout
        points = (sweep_dir / "report" / "points.csv").read_text()
        assert "hidden=8" in points and "hidden=16" in points and "FINISHED" in points
    finally:
        stop(server)
