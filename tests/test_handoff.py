"""Handed-off runs (trainer/record/journal.py): a local warm worker on a SQLite store (its rank 0)
journals its runs without importing MLflow, and the sweeper, which has it loaded, creates and
sends them. Real stores, real ranks; a worker's MLflow import is held to prove it never happens."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import NO_TIMING_FLOOR, sweeper_command
from tests.test_sweeper import FAST, children_of, parents, runs, sweep
from trainer import metrics
from trainer.lifecycle import queue_files
from trainer.record import journal, store, tracking

# Imported first by every Python process of the sweep: MLflow's import in the process whose command
# names WHO (a warm worker's, a sweeper's) waits for the sweep's end (the file HOLD_MLFLOW_UNTIL
# names), as if it took that long. The other processes' imports are not held.
HOLD_MLFLOW = """
import importlib.abc, os, sys, time

class Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "mlflow" or "WHO" not in (sys.argv[0] if sys.argv else ""):
            return None
        spec = next(s for f in sys.meta_path if f is not self and (s := f.find_spec(name, path, target)))
        run = spec.loader.exec_module

        def exec_module(module):  # held here, under the module's own lock (the finder holds every import's)
            open(os.environ["HOLD_MLFLOW_UNTIL"] + ".asked", "a").close()  # that it was asked for, and when
            deadline = time.time() + 120
            while not os.path.exists(os.environ["HOLD_MLFLOW_UNTIL"]) and time.time() < deadline:
                time.sleep(0.05)
            run(module)

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Hold())
"""


def held_mlflow(tmp_path: Path, who: str) -> tuple[dict[str, str], Path]:
    """The environment of a sweep whose ``who`` (``trainer/worker.py``, ``sweeper/__main__.py``)
    imports MLflow only once the returned file exists."""
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(HOLD_MLFLOW.replace("WHO", who))
    release = tmp_path / "released"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hold), *sys.path]), "HOLD_MLFLOW_UNTIL": str(release)}
    return env, release


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in store.client(uri).get_metric_history(run_id, key))


def test_a_handed_off_run_is_created_and_sent_by_another_process_whole(mlflow_uri, tmp_path):
    """The recorder opens no store: its writes, its end and a check landing after it go to the
    journal; the sweeper's sends (here in order: up to the end, then the rest) make one run, its
    end time the training's, every metric once."""
    folder = tmp_path / "point"
    folder.mkdir()

    def setup(recorder: tracking.Recorder) -> None:
        recorder.log_params({"hidden": 16})
        recorder.log_text("hidden: 16\n", "config.yaml")

    recorder = tracking.Recorder(mlflow_uri, "e", "p", lambda: {"a": "1"}, setup, background=True, handoff=str(folder))
    recorder.set_tags({"b": "2"})
    for step in range(3):
        recorder.metric(metrics.TRAIN_LOSS, 1.0 / (step + 1), step)
    recorder.flush()
    assert recorder.handed_off and recorder.run_id is None and recorder.client is None  # no store opened
    recorder.finish("FINISHED", close=False)  # a check still computing
    sweeper_client = store.client(mlflow_uri)
    assert sweeper_client.get_experiment_by_name("e") is None  # nothing created before the sweeper's send
    assert not journal.Journal(folder).send(sweeper_client)  # sent up to the end; a close still to come
    run_id = (folder / journal.RUN).read_text()
    assert recorder.run_id == run_id
    run = sweeper_client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "p"
    assert journal.Journal(folder).unsent() == []
    recorder.metric(metrics.weight_error("max"), 1e-6)  # the check lands after the run ended
    recorder.close()  # does not wait: its sweeper sends it
    assert journal.Journal(folder).send(sweeper_client) and not (folder / journal.FILE).exists()
    run = sweeper_client.get_run(run_id)
    assert run.data.params == {"hidden": "16"} and run.data.tags["a"] == "1" and run.data.tags["b"] == "2"
    assert history(mlflow_uri, run_id, metrics.TRAIN_LOSS) == [(0, 1.0), (1, 0.5), (2, 1.0 / 3)]
    assert run.data.metrics[metrics.weight_error("max")] == 1e-6
    assert [a.path for a in sweeper_client.list_artifacts(run_id)] == ["config.yaml"]
    done = [line for line in (folder / journal.DONE).read_text().splitlines() if '"op": "end"' in line]
    assert run.info.end_time == int(done[0].split('"end_ms": ')[1].rstrip("}"))  # when it ended, not when sent
    assert len(sweeper_client.search_runs([run.info.experiment_id])) == 1


def test_two_senders_of_one_journal_make_one_run_and_send_each_line_once(mlflow_uri, tmp_path):
    folder = tmp_path / "point"
    created = {"experiment": "e", "name": "p", "tags": {journal.HANDOFF_TAG: "x1"}, "start_ms": 1}
    j = journal.Journal(folder, mlflow_uri, None, created)
    for i in range(40):
        j.append({"op": "metrics", "metrics": [[metrics.TRAIN_LOSS, float(i), 1000 + i, i]]})
    j.append({"op": "end", "status": "FINISHED", "close": True, "end_ms": 5000})
    results: list[bool] = []
    senders = [
        threading.Thread(target=lambda: results.append(journal.Journal(folder).send(store.client(mlflow_uri))))
        for _ in range(2)
    ]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    assert results == [True, True]
    (run,) = store.client(mlflow_uri).search_runs([store.client(mlflow_uri).get_experiment_by_name("e").experiment_id])
    assert history(mlflow_uri, run.info.run_id, metrics.TRAIN_LOSS) == [(i, float(i)) for i in range(40)]
    assert run.info.status == "FINISHED" and run.info.end_time == 5000


def _waits_for_lock_on(folder: Path) -> bool:
    """Whether some process waits for a flock on ``folder`` (a ``->`` line of /proc/locks names its inode)."""
    inode = f":{os.stat(folder).st_ino} "
    return any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


def test_a_sweeps_end_finds_a_journal_its_worker_sent_since_and_counts_it_sent(mlflow_uri, tmp_path):
    """The sweep's end lists the journals left, then sends them one by one; a worker's end sends one
    of them in between (its file gone): that one reads as sent, not as an error that fails the sweep."""
    folders = [tmp_path / "sweep" / name for name in ("0", "1")]
    for i, folder in enumerate(folders):
        created = {"experiment": "e", "name": f"p{i}", "tags": {journal.HANDOFF_TAG: f"r{i}"}, "start_ms": 1}
        j = journal.Journal(folder, mlflow_uri, None, created)
        j.append({"op": "metrics", "metrics": [[metrics.TRAIN_LOSS, 0.5, 1000, 0]]})
        j.append({"op": "end", "status": "FINISHED", "close": True, "end_ms": 2000})
    held = os.open(folders[0], os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # the first journal's other sender, mid-send
    out: list = []
    end = threading.Thread(target=lambda: out.extend(journal.send_left(tmp_path / "sweep")))
    end.start()
    deadline = time.monotonic() + 60
    while not _waits_for_lock_on(folders[0]) and time.monotonic() < deadline:  # listed both, waits on the first
        time.sleep(0.02)
    assert journal.Journal(folders[1]).send(store.client(mlflow_uri))  # the second's worker sends it all
    os.close(held)
    end.join(60)
    assert [(p.parent.name, what) for p, what in out] == [("0", "sent"), ("1", "sent")]
    client = store.client(mlflow_uri)
    found = client.search_runs([client.get_experiment_by_name("e").experiment_id])
    assert sorted(r.info.run_name for r in found) == ["p0", "p1"]
    for r in found:
        assert r.info.status == "FINISHED" and history(mlflow_uri, r.info.run_id, metrics.TRAIN_LOSS) == [(0, 0.5)]


def test_a_sender_that_died_before_noting_the_run_finds_it_instead_of_creating_another(mlflow_uri, tmp_path):
    folder = tmp_path / "point"
    created = {"experiment": "e", "name": "p", "tags": {journal.HANDOFF_TAG: "x2"}, "start_ms": 1}
    j = journal.Journal(folder, mlflow_uri, None, created)
    j.append({"op": "end", "status": "FINISHED", "close": True, "end_ms": 2})
    client = store.client(mlflow_uri)
    run_id = j._create(client)
    (folder / journal.RUN).unlink()  # as if its sender died between creating the run and noting it:
    (folder / f"{journal.RUN}.creating").touch()  # its mark that it was creating one
    assert j.send(client) and (folder / journal.RUN).read_text() == run_id
    assert len(client.search_runs([client.get_experiment_by_name("e").experiment_id])) == 1


@pytest.mark.mpi
def test_a_sweep_whose_workers_never_load_mlflow_records_every_run(tmp_path, mlflow_uri):
    """The workers' MLflow import held until the sweep has ended: every run is handed off and the
    sweeper records it whole; the same runs as a sweep whose workers record them themselves."""
    env, release = held_mlflow(tmp_path, "trainer/worker.py")
    # Unit pixels and fan-in weights: 8 steps agree with the CPU to float32 rounding at every nproc (the
    # course's byte pixels amplify the ranks' rounding: 0.31 at hidden=24, nproc=2, standalone too).
    args = ["hidden=16,24", "nproc=1,2", *FAST, "launcher.cpus=2", "data.scale=unit", "model.init=fan_in"]
    held = sweep(args, tmp_path, env=env)
    release.touch()
    assert held.returncode == 0, held.stdout + held.stderr
    (parent,) = parents(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id)
    assert len(runs(mlflow_uri)) == 5 and {r.info.status for r in kids.values()} == {"FINISHED"}
    assert len({r.data.tags[metrics.TAG_WORKER] for r in kids.values()}) == 2  # one a shape, MLflow never loaded
    for r in kids.values():
        assert journal.HANDOFF_TAG in r.data.tags and r.data.tags[metrics.TAG_CHECK] == "done"
        assert r.data.metrics[metrics.weight_error("max")] < 1e-4  # its own check: another run's would be far off
    dones = list(tmp_path.glob(f"multirun/*/*/*/{journal.DONE}"))
    assert len(dones) == 4 and not list(tmp_path.glob(f"multirun/*/*/*/{journal.FILE}"))
    assert {(d.parent / journal.RUN).read_text() for d in dones} == {r.info.run_id for r in kids.values()}

    direct_uri = f"sqlite:///{tmp_path / 'direct.db'}"
    direct = sweep([*args, f"mlflow.tracking_uri={direct_uri}"], tmp_path)
    assert direct.returncode == 0, direct.stdout + direct.stderr
    (direct_parent,) = parents(direct_uri)
    plain = children_of(direct_uri, direct_parent.info.run_id)
    for name, r in kids.items():
        d = plain[name]  # (on a busy machine its first run may be handed off too)
        assert set(r.data.params) == set(d.data.params) and set(r.data.metrics) == set(d.data.metrics)
        assert set(r.data.tags) ^ set(d.data.tags) <= {journal.HANDOFF_TAG}
        assert history(mlflow_uri, r.info.run_id, metrics.TRAIN_LOSS) == history(
            direct_uri, d.info.run_id, metrics.TRAIN_LOSS
        )
        arts = {a.path for a in store.client(mlflow_uri).list_artifacts(r.info.run_id)}
        assert arts == {a.path for a in store.client(direct_uri).list_artifacts(d.info.run_id)}


@pytest.mark.mpi
def test_a_worker_waits_for_its_live_sweeper_however_late_it_sends(tmp_path, mlflow_uri):
    """#47: the sweeper stopped (SIGSTOP, as a busy machine may leave it unscheduled) while its point
    trains, and for longer than the 5 s a worker's end once waited: the worker waits for it and
    never imports MLflow (3-4 CPU-s, where CPU is short); the sweeper, going on, sends the run whole."""
    runs(mlflow_uri)  # the store first: the parent exists before the point's run, which awaits no parent
    env, release = held_mlflow(tmp_path, "trainer/worker.py")
    args = ["hidden=16", "epochs=100", "batch_size=10", "data.n_train=200", "data.n_test=50", *NO_TIMING_FLOOR]
    proc = subprocess.Popen(sweeper_command(args), cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    asked = Path(f"{release}.asked")
    try:
        point = wait_for_file(tmp_path, f"multirun/*/*/0/{journal.FILE}", proc)
        proc.send_signal(signal.SIGSTOP)  # while it trains
        wait_for_file(point, queue_files.RESULT, proc)  # the worker's end: its run's journal not sent yet
        assert (point / journal.FILE).exists() and not (point / journal.DONE).exists()
        time.sleep(journal.STOPPED_WAIT_S + 2)
        assert not asked.exists(), "the worker imported MLflow while its sweeper lived"
    finally:
        proc.send_signal(signal.SIGCONT)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        release.touch()
    assert proc.returncode == 0, out
    assert not asked.exists(), "the worker imported MLflow"
    (parent,) = parents(mlflow_uri)
    (kid,) = children_of(mlflow_uri, parent.info.run_id).values()
    assert kid.info.status == "FINISHED" and journal.HANDOFF_TAG in kid.data.tags
    assert len(history(mlflow_uri, kid.info.run_id, metrics.TRAIN_LOSS_EPOCH)) == 100  # every epoch, once
    assert (point / journal.DONE).exists() and not (point / journal.FILE).exists()


def wait_for_file(folder: Path, pattern: str, proc: subprocess.Popen, timeout: float = 120) -> Path:
    """The folder of the first file ``pattern`` matches under ``folder``; fails should ``proc`` end first."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        found = next(folder.glob(pattern), None)
        if found is not None:
            return found.parent
        time.sleep(0.05)
    raise AssertionError(f"no {pattern} under {folder} (the sweep's status: {proc.poll()})")


def test_the_sweepers_sender_sends_a_run_that_started_and_ended_between_two_looks(mlflow_uri, tmp_path):
    """A tiny point can be claimed, trained and ended between two steps of the watch, never seen
    running: its journal is still sent by the sweeper's thread, not left for the sweep's end."""
    from sweeper.points import Point
    from sweeper.track.handoff import HandoffSender
    from sweeper.track.records import SweepRecord
    from sweeper.track.watch import Flight

    folder = tmp_path / "0"
    folder.mkdir()
    recorder = tracking.Recorder(mlflow_uri, "e", "p", dict, lambda r: None, background=True, handoff=str(folder))
    recorder.metric(metrics.TRAIN_LOSS, 0.5, 0)
    recorder.finish("FINISHED")
    point = Point(index=0, overrides=[], trainer=None, dir=folder)  # only its index and folder are read here
    sender = HandoffSender(SweepRecord(mlflow_uri, "e"), poll_s=0.05)
    try:
        sender(Flight(queued=[], finished={0: None}, started={0: point}))  # ended before any look saw it run
        for _ in range(100):
            if (folder / journal.DONE).exists():
                break
            threading.Event().wait(0.05)
    finally:
        sender.stop()
    assert (folder / journal.DONE).exists() and not (folder / journal.FILE).exists()
    run = store.client(mlflow_uri).get_run((folder / journal.RUN).read_text())
    assert run.info.status == "FINISHED" and run.data.metrics[metrics.TRAIN_LOSS] == 0.5


def test_a_journal_caught_up_at_once_is_one_batch_then_its_other_lines():
    """Unsent lines go in chunks of at most journal.BATCH values: one store write of the chunk's
    metrics, params and tags (a later tag winning), then its texts and its end in their order; the
    offset noted is the chunk's last line's."""
    lines = [
        (10, {"op": "run"}),
        (20, {"op": "params", "params": {"hidden": "16"}}),
        (30, {"op": "text", "text": "x", "name": "config.yaml"}),
        (40, {"op": "tags", "tags": {"check": "pending"}}),
        (50, {"op": "metrics", "metrics": [["loss", 1.0, 5, 0]]}),
        (60, {"op": "end", "status": "FINISHED", "close": False}),
        (70, {"op": "tags", "tags": {"check": "done"}}),
        (80, {"op": "metrics", "metrics": [["err", 1e-6, 9, 0]]}),
        (90, {"op": "close"}),
    ]
    [(offset, entries)] = list(journal._chunks(lines))
    assert offset == 90 and [e["op"] for e in entries] == ["batch", "run", "text", "end", "close"]
    assert entries[0] == {
        "op": "batch",
        "metrics": [["loss", 1.0, 5, 0], ["err", 1e-6, 9, 0]],
        "params": {"hidden": "16"},
        "tags": {"check": "done"},
    }
    big = [(i + 1, {"op": "metrics", "metrics": [["m", 0.0, 0, 600 * i + j] for j in range(600)]}) for i in range(3)]
    chunks = list(journal._chunks(big))  # 1800 values: no chunk over BATCH (1000) but a line's own
    assert [(o, len(e[0]["metrics"])) for o, e in chunks] == [(1, 600), (2, 600), (3, 600)]
    assert list(journal._chunks([])) == []
