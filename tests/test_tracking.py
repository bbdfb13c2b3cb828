"""tracking.Recorder opening its run in the background: what waits, and how its errors surface."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer import metrics
from trainer.record import store, tracking, uri_check


def test_background_run_records_what_a_foreground_one_does(mlflow_uri):
    def setup(recorder: tracking.Recorder) -> None:
        recorder.log_params({"hidden": 16})

    recorder = tracking.Recorder(mlflow_uri, "bg", "r", lambda: {"a": "1"}, setup, background=True)
    recorder.set_tags({"b": 2})  # queued while the run may not exist yet
    recorder.metric(metrics.TRAIN_LOSS, 0.5, 3)
    recorder.finish()
    run = store.client(mlflow_uri).get_run(recorder.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "r"
    assert run.data.params == {"hidden": "16"}
    assert run.data.tags["a"] == "1" and run.data.tags["b"] == "2"
    assert run.data.metrics == {metrics.TRAIN_LOSS: 0.5}


def test_an_error_in_the_background_fails_the_run_once(mlflow_uri):
    """The opening's error is raised by the next call that needs the run; the failure path can
    then still record into the run that exists."""

    def setup(_recorder: tracking.Recorder) -> None:
        raise ValueError("params refused")

    recorder = tracking.Recorder(mlflow_uri, "bg", None, {}, setup, background=True)
    recorder.metric(metrics.TRAIN_LOSS, 0.5)  # only queued: never raises
    with pytest.raises(ValueError, match="params refused"):
        recorder.flush()
    run_id = recorder.settled_run_id()
    assert run_id is not None
    recorder.flush()  # the failure path: the queued metrics still land
    tracking.mark_ended(mlflow_uri, run_id, "FAILED", "Traceback: params refused", 0)
    run = store.client(mlflow_uri).get_run(run_id)
    assert run.info.status == "FAILED" and run.data.metrics == {metrics.TRAIN_LOSS: 0.5}


def test_a_run_that_could_not_be_created_is_an_error(tmp_path):
    (tmp_path / "mlflow.db").write_text("not a database")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert store.opens_in_background(uri)
    assert not store.opens_in_background(f"sqlite:///{tmp_path / 'missing' / 'mlflow.db'}")
    assert not store.opens_in_background("http://localhost:5000")
    recorder = tracking.Recorder(uri, "bg", None, {}, background=True)
    with pytest.raises(Exception):  # noqa: B017  SQLAlchemy's or MLflow's, as a foreground opening raises
        recorder.flush()
    assert recorder.settled_run_id() is None
    with pytest.raises(RuntimeError, match="no MLflow run"):
        recorder.flush()


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("foo://bar", r"mlflow.tracking_uri=foo://bar: not a tracking URI MLflow opens .* use sqlite:///"),
        ("mlflow.db", r"not a tracking URI MLflow opens"),
        ("sqlite:////proc/sweepscale/mlflow.db", r"cannot create the database in /proc/sweepscale"),
        ("sqlite:////proc/mlflow.db", r"cannot create the database in /proc \("),
        ("http://127.0.0.1:9", r"no tracking server answers at 127.0.0.1:9 .*start it"),
        ("mssql://user@127.0.0.1/runs", r"the mssql driver is not installed here \(No module named 'pyodbc'\)"),
    ],
)
def test_tracking_uri_mistakes_are_named_in_a_moment(uri, message):
    import time

    from trainer.errors import ConfigError

    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=message):
        uri_check.check_uri(uri)
    assert time.perf_counter() - t0 < uri_check.CONNECT_S + 1


def test_a_web_server_that_is_not_mlflow_is_named_before_the_ranks_start(tmp_path):
    """Something answers on the port, but not MLflow's REST API (#33): refused before any rank, in a moment."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    web = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        uri = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "trainer", "nproc=2", f"mlflow.tracking_uri={uri}"]
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    finally:
        web.terminate()
        web.wait(timeout=30)
    assert done.returncode == 2, done.stderr
    said = f"Error: mlflow.tracking_uri={uri}: 127.0.0.1:{port} answers, but not as an MLflow tracking server"
    assert said in done.stderr and "HTTP 404" in done.stderr and "Traceback" not in done.stderr


def test_a_server_slow_to_answer_its_first_query_passes_the_check():
    """A server that accepts the connection but takes longer than the connection's 3 s to answer
    (a new server's first query, on a busy host: seen in CI) is not refused as "not MLflow"."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(uri_check.CONNECT_S + 1)
            body = json.dumps({"experiments": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri_check.check_uri(f"http://127.0.0.1:{server.server_address[1]}")  # no ConfigError
    finally:
        server.shutdown()
        server.server_close()


def test_a_good_sqlite_uri_passes_and_creates_nothing(tmp_path):
    uri_check.check_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert list(tmp_path.iterdir()) == []


def test_the_trainer_names_a_bad_uri_before_its_ranks_start(tmp_path):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "trainer", "nproc=2", "mlflow.tracking_uri=foo://bar"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "Error: mlflow.tracking_uri=foo://bar: not a tracking URI MLflow opens" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_sigterm_that_a_library_turned_into_its_own_error_still_ends_the_run_killed(mlflow_uri, monkeypatch):
    """SQLAlchemy wraps what interrupts a query. The run ended FAILED, and a warm worker, its
    SIGTERM now ignored, went on to train the next points to FINISHED."""
    import os
    import signal
    import time

    from trainer import run
    from trainer.lifecycle import requeue
    from trainer.ranks import sigterm

    monkeypatch.setattr(sigterm, "_seen", False)
    before = signal.getsignal(signal.SIGTERM)
    recorder = tracking.Recorder(mlflow_uri, "e", "r", {}, None)
    try:
        sigterm.install()
        try:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here
            except sigterm.Terminated as interrupted:
                raise RuntimeError("(sqlite3.OperationalError) interrupted") from interrupted
        except RuntimeError as wrapped:
            status = run._record_failure(wrapped, mlflow_uri, recorder.run_id, recorder, 0)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert sigterm.seen() and status == requeue.KILLED_STATUS
    assert store.client(mlflow_uri).get_run(recorder.run_id).info.status == "KILLED"


def test_a_sigterm_during_a_store_write_is_raised_when_the_write_is_whole(mlflow_uri, monkeypatch):
    """#33 item 10: SIGTERM raised inside SQLite's write left the store locked by a worker that
    never ended, and the other workers waited 20 s for it. Now the write ends, whole, then the run
    is interrupted, and another process's write goes through at once."""
    import os
    import signal

    from trainer.ranks import sigterm

    monkeypatch.setattr(sigterm, "_seen", False)
    before = signal.getsignal(signal.SIGTERM)
    recorder = tracking.Recorder(mlflow_uri, "e", "r", {}, None)
    for step in range(3000):  # three batches: the signal comes before the first
        recorder.metric(metrics.TRAIN_LOSS, 1.0 / (step + 1), step)
    try:
        sigterm.install()
        with pytest.raises(sigterm.Terminated), sigterm.deferred():
            os.kill(os.getpid(), signal.SIGTERM)  # handled here, before the write starts
            recorder.flush()
    finally:
        signal.signal(signal.SIGTERM, before)
    assert sigterm.seen()
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from trainer.record import store; store.client({mlflow_uri!r}).set_tag({recorder.run_id!r}, 'k', 'v')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.returncode == 0, other.stderr
    history = store.client(mlflow_uri).get_metric_history(recorder.run_id, metrics.TRAIN_LOSS)
    assert len(history) == 3000


SKINNY = """
import sys
from trainer.record import store
uri = sys.argv[1]
c = store.client(uri)
run = c.create_run(store.ensure_experiment(c, uri, "e"))
c.log_metric(run.info.run_id, "loss", 0.5)
c.set_terminated(run.info.run_id)
assert "pandas" not in sys.modules, "MLflow imported pandas"
import pandas  # still importable, for whoever wants it

print(pandas.__name__, len(c.get_metric_history(run.info.run_id, "loss")))
"""


def test_a_recording_process_loads_mlflow_without_pandas_which_stays_importable(tmp_path):
    """MLflow's client as mlflow-skinny has it (store.load_mlflow): its pandas datasets, which no run
    logs, were 0.6-0.8 CPU-s of every recording process; a run still records, pandas still imports."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    done = subprocess.run([sys.executable, "-c", SKINNY, uri], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pandas", "1"]


OPEN_AT = """
import sys, time
from trainer.record import store, tracking
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # every process opens the store at the same instant
store.ensure_experiment(store.client(sys.argv[1]), sys.argv[1], "sweepscale")
"""


def test_processes_opening_a_new_sqlite_store_at_once_all_succeed(tmp_path, monkeypatch):
    """MLflow creates a new SQLite store's tables with migrations that fail when two processes
    run them at once (seen: 5 of 8 processes in pairs died so): store.client takes turns (a pair
    here). First with no template of the empty store (migrations), then with the one the first
    attempt kept."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for attempt in range(2):
        uri = f"sqlite:///{tmp_path / f'mlflow{attempt}.db'}"
        at = str(time.time() + 4)  # past every process's imports
        procs = [
            subprocess.Popen([sys.executable, "-c", OPEN_AT, uri, at], stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        for p in procs:
            assert p.wait(timeout=60) == 0, p.stderr.read()
        assert [e.name for e in store.client(uri).search_experiments()] == ["sweepscale", "Default"]


def test_a_new_store_starts_from_the_kept_empty_schema(tmp_path, monkeypatch):
    """The first new SQLite store of an MLflow version is kept, empty, as a template; the next new
    store is its copy: the same schema and version as MLflow's own, its Default experiment made by
    MLflow for the new store's folder, and it records."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = store.client(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}")  # MLflow's default artifacts: ./mlruns
    import mlflow

    template = store.template_folder() / f"mlflow-{mlflow.__version__}.db"
    assert template.is_file()
    with sqlite3.connect(template) as con:  # a mark MLflow ignores: the next store must carry it
        con.execute("PRAGMA user_version = 31")
    monkeypatch.chdir(tmp_path / "b")
    uri = f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}"
    second = store.client(uri)

    def schema(db: Path) -> tuple:
        with sqlite3.connect(db) as con:
            tables = sorted(con.execute("SELECT name, sql FROM sqlite_master"))
            return tables, con.execute("SELECT version_num FROM alembic_version").fetchall()

    assert schema(tmp_path / "b" / "mlflow.db") == schema(tmp_path / "a" / "mlflow.db") == schema(template)
    with sqlite3.connect(template) as con:
        assert con.execute("SELECT count(*) FROM experiments").fetchone() == (0,)
    with sqlite3.connect(tmp_path / "b" / "mlflow.db") as con:
        assert con.execute("PRAGMA user_version").fetchone() == (31,)  # a copy, not MLflow's migrations
    assert first.get_experiment("0").artifact_location == str(tmp_path / "a" / "mlruns" / "0")
    assert second.get_experiment("0").artifact_location == str(tmp_path / "b" / "mlruns" / "0")
    run = second.create_run(store.ensure_experiment(second, uri, "sweepscale")).info.run_id
    second.log_metric(run, "loss", 0.5)
    second.set_terminated(run)
    assert store.client(uri).get_run(run).data.metrics == {"loss": 0.5}


def test_two_trainers_on_a_new_sqlite_store_both_finish(idx_dir, mlflow_uri, tmp_path):
    """#33's repro: two standalone runs started together on a fresh MLFLOW_TRACKING_URI."""
    from tests.test_trainer_runs import COMMON

    cmd = [sys.executable, "-m", "trainer", *COMMON, f"data.dir={idx_dir}", "check.reference=false"]
    procs = [
        subprocess.Popen([*cmd, f"seed={s}"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for s in (1, 2)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    runs = store.client(mlflow_uri).search_runs(
        [store.client(mlflow_uri).get_experiment_by_name("sweepscale").experiment_id]
    )
    assert sorted(r.data.params["seed"] for r in runs) == ["1", "2"]
    assert {r.info.status for r in runs} == {"FINISHED"}


def test_a_crafted_journal_cannot_upload_files_outside_its_folder(mlflow_uri, tmp_path):
    """`python -m sweeper.sync` sends only artifacts the journal copied beside itself (#33)."""
    from trainer.record import journal

    client = store.client(mlflow_uri)
    run_id = client.create_run(store.ensure_experiment(client, mlflow_uri, "sweepscale")).info.run_id
    point = tmp_path / "multirun" / "0"
    j = journal.Journal(point, mlflow_uri, run_id)
    kept = tmp_path / "weights.npz"
    kept.write_bytes(b"weights")
    j.keep_file(kept, "weights.npz")
    secret = tmp_path / "secret.txt"
    secret.write_text("not the run's")
    for name in (str(secret), "../../secret.txt", "../journal.jsonl"):
        j.append({"op": "artifact", "name": name})
    (point / journal.FILES / "link.txt").symlink_to(secret)  # a link out of the folder, too
    j.append({"op": "artifact", "name": "link.txt"})
    j.append({"op": "end", "status": "FINISHED"})
    result = subprocess.run(
        [sys.executable, "-m", "sweeper.sync", str(tmp_path / "multirun")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stdout + result.stderr  # sent, but not all of it: said, rc 1
    assert result.stderr.count("journal line refused: artifact") == 4
    assert "4 line(s) refused" in result.stdout, result.stdout
    assert [a.path for a in client.list_artifacts(run_id)] == ["weights.npz"]
    assert client.get_run(run_id).info.status == "FINISHED" and not (point / journal.FILE).exists()


def test_a_journal_whose_files_folder_is_a_link_uploads_nothing_outside(mlflow_uri, tmp_path):
    """#47: `journal_files/` itself a link to another folder: its files were taken as the journal's."""
    from trainer.record import journal

    client = store.client(mlflow_uri)
    run_id = client.create_run(store.ensure_experiment(client, mlflow_uri, "sweepscale")).info.run_id
    point, elsewhere = tmp_path / "multirun" / "0", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "hostname").write_text("not the run's")
    j = journal.Journal(point, mlflow_uri, run_id)
    (point / journal.FILES).symlink_to(elsewhere, target_is_directory=True)
    j.append({"op": "artifact", "name": "hostname"})
    j.append({"op": "end", "status": "FINISHED"})
    result = subprocess.run(
        [sys.executable, "-m", "sweeper.sync", str(tmp_path / "multirun")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "journal line refused: artifact 'hostname'" in result.stderr and "1 line(s) refused" in result.stdout
    assert client.list_artifacts(run_id) == []
    assert client.get_run(run_id).info.status == "FINISHED" and (elsewhere / "hostname").exists()


def test_sync_of_a_folder_that_is_not_there_says_so(tmp_path):
    """#47: `python -m sweeper.sync /nonexistent` answered "nothing to send" with rc 0."""
    (tmp_path / "a_file").write_text("")
    for target, said in (("nonexistent", "does not exist"), ("a_file", "is a file, not a folder")):
        result = subprocess.run(
            [sys.executable, "-m", "sweeper.sync", str(tmp_path / target)], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2 and said in result.stderr, result.stdout + result.stderr
        assert "nothing to send" not in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing created


def test_a_damaged_journal_is_said_in_a_line(mlflow_uri, tmp_path):
    """#47: a journal whose lines are not JSON gave a raw JSONDecodeError traceback."""
    from trainer.record import journal

    client = store.client(mlflow_uri)
    run_id = client.create_run(store.ensure_experiment(client, mlflow_uri, "sweepscale")).info.run_id
    bad_header, bad_line = tmp_path / "multirun" / "0", tmp_path / "multirun" / "1"
    bad_header.mkdir(parents=True)
    (bad_header / journal.FILE).write_text("{not json\n")
    j = journal.Journal(bad_line, mlflow_uri, run_id)
    j.append({"op": "tags", "tags": {"a": "1"}})
    with open(bad_line / journal.FILE, "a") as f:
        f.write("{half a line\n")
    result = subprocess.run(
        [sys.executable, "-m", "sweeper.sync", str(tmp_path / "multirun")], capture_output=True, text=True, timeout=120
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in out, out
    assert "its first line is no journal's header" in out and "not sent: JSONDecodeError" in out, out
    assert client.get_run(run_id).info.status == "RUNNING"  # nothing pretended: the run's end never came
