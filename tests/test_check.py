"""The CPU check (trainer/lifecycle/check.py, trainer/lifecycle/reference_jobs.py): the weights after k steps against an
independent replay, a run that ends before its check, a check that fails or whose process is
killed. Real runs on real ranks, real spawned children, a real SQLite store."""

from __future__ import annotations

import csv
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import sweeper_command
from tests.test_sweeper import FAST, children_of, parents, runs, sweep
from tests.test_trainer_runs import COMMON, final_weights, only_run, trainer
from trainer import data, metrics
from trainer.core import model, reference
from trainer.core.loop import Schedule
from trainer.lifecycle import queue_files, reference_jobs
from trainer.record import store

pytestmark = pytest.mark.mpi

LAYOUT = model.Layout(D=784, H=16)
SCHEDULE = Schedule(7, 0.3, 1e-4, 2, False, 0)  # COMMON's: 57 samples, 9 batches an epoch


def key_of(ds: data.Dataset, steps: int, dtype: str = "float64") -> str:
    return reference.cache_key(
        LAYOUT, SCHEDULE, dtype, 0, ds.fingerprint(), init="fan_in", scale="unit", steps=steps
    )  # COMMON's conventions


def replay(x: np.ndarray, y: np.ndarray, flat: np.ndarray, steps: int, B: int = 7, lr: float = 0.3) -> np.ndarray:
    """The course's SGD written out again in float64, apart from trainer/: the first ``steps`` steps."""
    D, H, C, reg = x.shape[1], LAYOUT.H, 10, 1e-4
    W1, b1 = flat[: H * D].reshape(H, D).copy(), flat[H * D : H * D + H].copy()
    W2, b2 = flat[H * D + H : H * D + H + C * H].reshape(C, H).copy(), flat[-C:].copy()
    x, n_batches = x.astype(np.float64), -(-len(y) // B)
    for s in range(steps):
        xb, yb = x[(s % n_batches) * B :][:B], y[(s % n_batches) * B :][:B]
        a1 = 1 / (1 + np.exp(-(xb @ W1.T + b1)))
        z2 = a1 @ W2.T + b2
        p = np.exp(z2 - z2.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(yb)), yb] -= 1
        d2 = p / len(yb)
        d1 = (d2 @ W2) * a1 * (1 - a1)
        W2, b2 = W2 * (1 - lr * reg) - lr * d2.T @ a1, b2 - lr * d2.sum(0)
        W1, b1 = W1 * (1 - lr * reg) - lr * d1.T @ xb, b1 - lr * d1.sum(0)
    return np.concatenate([W1.ravel(), b1, W2.ravel(), b2])


# Each rank count and each dtype once: the ranks' sum against a sequential run is
# tests/test_trainer_runs.py's (1e-12 on 1 and 3 ranks); here the check's snapshot and its tolerance.
@pytest.mark.parametrize(("nproc", "dtype"), [(2, "float64"), (1, "float32")])
def test_the_error_after_k_steps_is_against_an_independent_replay(nproc, dtype, idx_dir, mlflow_uri, tmp_path):
    """k = one epoch (9 steps) of a 2-epoch run: the check compares the run's weights after step 9,
    the reference is the replay's 9 steps, and the run records k."""
    cache = tmp_path / "cache"
    args = [*COMMON, f"data.dir={idx_dir}", f"dtype={dtype}", f"nproc={nproc}", "check.steps=9"]
    assert trainer([*args, f"check.cache_dir={cache}"], tmp_path).returncode == 0
    client, run = only_run(mlflow_uri)
    assert run.info.status == "FINISHED" and run.data.tags[metrics.TAG_CHECK_STEPS] == "9"
    assert run.data.tags[metrics.TAG_CHECK] == "done"
    ds = data.load(str(idx_dir), 57, None, dtype)
    init = model.init_params(LAYOUT, 0, dtype, "fan_in")
    independent = replay(ds.x_train, ds.y_train, init.astype(np.float64), 9)
    ref = np.load(cache / f"{key_of(ds, 9, dtype)}.npy")  # the reference the check used: 9 steps, not 18
    tolerance = 1e-12 if dtype == "float64" else 1e-5
    assert np.abs(ref - independent).max() / np.abs(independent).max() < tolerance
    assert np.abs(final_weights(client, run) - independent).max() > 1e-3  # the run went on past step 9
    # The run's weights after 9 steps are those of a run of one epoch (9 steps): the snapshot's step.
    one_epoch = tmp_path / "one_epoch"
    one_epoch.mkdir()
    uri = f"sqlite:///{one_epoch / 'mlflow.db'}"
    result = trainer([*args, "epochs=1", f"mlflow.tracking_uri={uri}", f"check.cache_dir={cache}"], one_epoch)
    assert result.returncode == 0, result.stderr
    after_9 = final_weights(*only_run(uri))
    expected = reference.relative_errors(LAYOUT, after_9, ref)["max"]
    assert run.data.metrics[metrics.weight_error("max")] == pytest.approx(expected, rel=1e-6, abs=1e-15)
    assert run.data.metrics[metrics.weight_error("max")] < tolerance


def hold_lock(cache: Path, key: str):
    """The reference of ``key`` waits while the returned file is open (its child blocks on the lock)."""
    cache.mkdir(parents=True, exist_ok=True)
    lock = open(cache / f"{key}.lock", "a")  # noqa: SIM115 (held across the test's steps)
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def wait_for(condition, timeout: float = 120, proc: subprocess.Popen | None = None):
    """``condition``'s first true value; fails at once, with its output, should ``proc`` end first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the trainer ended first ({proc.returncode}):\n{proc.stdout.read()}")
        time.sleep(0.2)
    raise AssertionError("timed out")


def runs_of(uri: str):
    client = store.client(uri)  # takes turns with the trainer should the store be new
    exp = client.get_experiment_by_name("sweepscale")
    return [] if exp is None else client.search_runs([exp.experiment_id])


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(pid):
            out.append(int(status.parent.name))
    return out


def trainer_on_a_held_reference(idx_dir: Path, cwd: Path) -> tuple:
    """A trainer (COMMON, the check after 10 steps) whose reference's lock the test holds: the
    reference waits until the returned lock is closed."""
    cache = cwd / "cache"
    lock = hold_lock(cache, key_of(data.load(str(idx_dir), 57, None, "float64"), 10))
    cmd = [
        sys.executable,
        "-m",
        "trainer",
        *COMMON,
        f"data.dir={idx_dir}",
        f"check.cache_dir={cache}",
        "check.steps=10",
    ]
    return lock, subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_slow_check_lands_in_the_run_after_it_ended(idx_dir, mlflow_uri, tmp_path):
    """The run ends FINISHED with its training, its check pending; the error lands in it later."""
    lock, proc = trainer_on_a_held_reference(idx_dir, tmp_path)
    try:
        run = wait_for(lambda: next((r for r in runs_of(mlflow_uri) if r.info.status == "FINISHED"), None), proc=proc)
        assert run.data.tags[metrics.TAG_CHECK] == "pending" and metrics.weight_error("max") not in run.data.metrics
        time.sleep(1)
        assert proc.poll() is None  # waiting for its check, the run already ended
    finally:
        lock.close()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    (run,) = runs_of(mlflow_uri)
    assert run.info.status == "FINISHED" and run.data.tags[metrics.TAG_CHECK] == "done"
    assert run.data.metrics[metrics.weight_error("max")] < 1e-12
    logged = run.data.metrics  # the error's time stamp is after the run's end
    (point,) = store.client(mlflow_uri).get_metric_history(run.info.run_id, metrics.weight_error("max"))
    assert point.timestamp > run.info.end_time and metrics.TRAIN_LOSS_EPOCH in logged
    assert "max weight error vs CPU after 10 steps" in out


def test_a_check_whose_process_is_killed_leaves_the_run_finished(idx_dir, mlflow_uri, tmp_path):
    lock, proc = trainer_on_a_held_reference(idx_dir, tmp_path)
    try:
        wait_for(lambda: any(r.info.status == "FINISHED" for r in runs_of(mlflow_uri)), proc=proc)
        spawned = wait_for(
            lambda: [c for c in children(proc.pid) if b"spawn" in Path(f"/proc/{c}/cmdline").read_bytes()]
        )
        for pid in spawned:
            os.kill(pid, signal.SIGKILL)  # the reference's process, waiting on the lock
    finally:
        lock.close()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    (run,) = runs_of(mlflow_uri)
    assert run.info.status == "FINISHED"
    assert run.data.tags[metrics.TAG_CHECK].startswith("failed: BrokenProcessPool")
    assert metrics.weight_error("max") not in run.data.metrics and metrics.TRAIN_LOSS_EPOCH in run.data.metrics


def test_a_cached_reference_needs_no_process(idx_dir, tmp_path):
    ds = data.load(str(idx_dir), 57, None, "float64")
    weights = np.arange(LAYOUT.size, dtype=np.float64)
    np.save(tmp_path / f"{key_of(ds, 10)}.npy", weights)
    init = model.init_params(LAYOUT, 0, "float64", "fan_in")
    key = lambda f: key_of(ds, 10)  # noqa: E731
    job = reference_jobs.submit(ds.x_train, ds.y_train, ds.fingerprint, key, LAYOUT, init, SCHEDULE, 10, tmp_path)
    ref = job.result(timeout=60)
    assert ref.cached and ref.key == key_of(ds, 10)
    np.testing.assert_array_equal(ref.params, weights)
    assert reference_jobs._pool is None  # read here: no child started


def test_a_prefetched_reference_is_the_one_the_point_then_finds(idx_dir, tmp_path):
    """A GPU worker starts its queued points' references before their turn (check.prefetch): the
    point's own check then reads the same weights from the cache, computing nothing."""
    from tests.conftest import compose
    from trainer.lifecycle import check
    from trainer.run import schedule_of

    cfg = compose(["hidden=16", "batch_size=7", "epochs=2", f"check.cache_dir={tmp_path}", "check.steps=4"])
    ds = data.load(str(idx_dir), 57, None, cfg.dtype.value)
    schedule = schedule_of(cfg)
    try:
        early = check.prefetch(cfg, ds, schedule).result(timeout=120)
        layout, init = check.first_weights(cfg, ds.n_features)
        later = check.start(cfg, layout, schedule, init, ds, 4).result(timeout=60)
    finally:
        reference_jobs.shutdown()
    assert not early.cached and later.cached and later.key == early.key
    np.testing.assert_array_equal(later.params, early.params)
    assert check.prefetch(compose(["check.reference=false"]), ds, schedule) is None


def test_a_configs_initial_weights_are_made_once_and_cannot_be_written(idx_dir):
    """The prefetch's initial weights are the point's own (check.first_weights): one array, made once,
    read-only, since the run and its reference share it; another seed makes other weights."""
    from tests.conftest import compose
    from trainer.lifecycle import check

    cfg = compose(["hidden=16"])
    ds = data.load(str(idx_dir), 57, None, cfg.dtype.value)
    layout, init = check.first_weights(cfg, ds.n_features)
    assert check.first_weights(compose(["hidden=16"]), ds.n_features)[1] is init
    with pytest.raises(ValueError, match="read-only"):
        init[0] = 1.0
    np.testing.assert_array_equal(init, model.init_params(layout, 0, cfg.dtype.value, cfg.model.init.value))
    assert not np.array_equal(check.first_weights(compose(["hidden=16", "seed=1"]), ds.n_features)[1], init)


def test_a_worker_waits_until_its_first_references_are_begun_in_their_children(idx_dir, tmp_path):
    """Before MPI's start (which holds the GIL) a GPU worker waits until its references need nothing
    more of it: begun in a child, here held at the key's lock so that it has begun but not ended,
    or read from the cache, with no child at all."""
    ds = data.load(str(idx_dir), 57, None, "float64")
    init = model.init_params(LAYOUT, 0, "float64", "fan_in")
    key = lambda f: key_of(ds, 10)  # noqa: E731
    cache = tmp_path / "cache"
    try:
        with hold_lock(cache, key_of(ds, 10)):
            job = reference_jobs.submit(ds.x_train, ds.y_train, ds.fingerprint, key, LAYOUT, init, SCHEDULE, 10, cache)
            reference_jobs.handed_over([job], timeout=120)
            assert job.handed.is_set() and reference_jobs._begun.value >= reference_jobs._sent >= 1
            assert not job.done()  # begun in its child, which waits for the lock
        assert not job.result(timeout=120).cached
        again = reference_jobs.submit(ds.x_train, ds.y_train, ds.fingerprint, key, LAYOUT, init, SCHEDULE, 10, cache)
        reference_jobs.handed_over([again], timeout=120)
        assert again.done() and again.result().cached
    finally:
        reference_jobs.shutdown()


SUBMIT = """
import sys, time
import numpy as np
from trainer import data
from trainer.core import model, reference
from trainer.lifecycle import reference_jobs, shared_arrays
from trainer.core.loop import Schedule
idx_dir, cache, out = sys.argv[1:]
layout, schedule = model.Layout(D=784, H=16), Schedule(7, 0.3, 1e-4, 2, False, 0)
ds = data.load(idx_dir, 57, None, "float64")
def key(fingerprint):
    return reference.cache_key(layout, schedule, "float64", 0, fingerprint, init="fan_in", scale="unit", steps=10)
init = model.init_params(layout, 0, "float64", "fan_in")
job = reference_jobs.submit(ds.x_train, ds.y_train, ds.fingerprint, key, layout, init, schedule, 10, cache)
while reference_jobs._pool is None:  # the cache had no file: the child is asked for it
    time.sleep(0.05)
print("submitted", flush=True)
ref = job.result()
np.save(out, ref.params)
print("cached" if ref.cached else "computed", flush=True)
print(" ".join(shared_arrays.names()), flush=True)
reference_jobs.shutdown()
"""


def test_two_processes_needing_one_reference_compute_it_once(idx_dir, tmp_path):
    """Two ranks 0 ask for one key with a fresh cache while its lock is held: once it is free, one
    child computes, the other waits for it and reads its file."""
    cache = tmp_path / "cache"
    ds = data.load(str(idx_dir), 57, None, "float64")
    with hold_lock(cache, key_of(ds, 10)):  # both children reach the lock before either computes
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", SUBMIT, str(idx_dir), str(cache), str(tmp_path / f"out{i}.npy")],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(2)
        ]
        for p in procs:
            assert p.stdout.readline().strip() == "submitted"
        time.sleep(3)  # the children start and wait on the lock
        assert not (cache / f"{key_of(ds, 10)}.npy").exists()
    said = [p.communicate(timeout=120)[0].strip().splitlines() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert sorted(lines[0] for lines in said) == ["cached", "computed"]
    blocks = [name for lines in said for name in lines[1].split()]
    assert len(blocks) == 4 and not [b for b in blocks if Path("/dev/shm", b.lstrip("/")).exists()]  # freed
    a, b = np.load(tmp_path / "out0.npy"), np.load(tmp_path / "out1.npy")
    np.testing.assert_array_equal(a, b)
    left = sorted(f.name for f in cache.iterdir())
    assert left == [".running", f"{key_of(ds, 10)}.lock", f"{key_of(ds, 10)}.npy"]
    assert not list((cache / ".running").iterdir())  # no reference counts as computing any more


def block_reference(cache: Path, overrides: list[str]) -> None:
    """Make the reference of this config fail: its lock file's path is a folder."""
    (cache / f"{reference_key(overrides)}.lock").mkdir(parents=True)


def reference_key(overrides: list[str]) -> str:
    """The reference cache's key of the trainer config these overrides make."""
    from tests.conftest import compose
    from trainer.config import check_steps
    from trainer.run import load_data, schedule_of

    cfg = compose(overrides)
    ds = load_data(cfg)
    layout, schedule = model.Layout(D=ds.n_features, H=cfg.hidden), schedule_of(cfg)
    steps = reference.steps_of(check_steps(cfg.check.steps), len(ds.y_train), schedule)
    return reference.cache_key(
        layout, schedule, cfg.dtype.value, cfg.seed, ds.fingerprint(), init=cfg.model.init.value,
        scale=cfg.data.scale.value, steps=steps,
    )  # fmt: skip


def test_a_failing_check_leaves_the_run_finished(idx_dir, mlflow_uri, tmp_path):
    args = [*COMMON, f"data.dir={idx_dir}", f"check.cache_dir={tmp_path / 'cache'}"]
    block_reference(tmp_path / "cache", args)
    result = trainer(args, tmp_path)
    assert result.returncode == 0, result.stderr
    _, run = only_run(mlflow_uri)
    assert run.info.status == "FINISHED"
    assert run.data.tags[metrics.TAG_CHECK].startswith("failed: IsADirectoryError")
    assert metrics.weight_error("max") not in run.data.metrics
    assert run.data.metrics[metrics.TRAIN_LOSS_EPOCH] > 0  # the training itself was recorded


def test_a_warm_worker_writes_each_result_once_its_check_landed(mlflow_uri, tmp_path):
    """A point whose check fails ends FINISHED in a warm worker, which goes on serving; every run is
    FINISHED once its result.json exists, the check's outcome in its tag and in the report."""
    cache = tmp_path / "cache"
    block_reference(cache, ["hidden=24", *FAST])
    args = ["hidden=16,24", f"check.cache_dir={cache}", *FAST, "launcher.cpus=1"]
    result = sweep(args, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (parent,) = parents(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id)
    assert {name: r.info.status for name, r in kids.items()} == {"hidden=16": "FINISHED", "hidden=24": "FINISHED"}
    assert len({r.data.tags[metrics.TAG_WORKER] for r in kids.values()}) == 1  # one worker served both
    assert kids["hidden=24"].data.tags[metrics.TAG_CHECK].startswith("failed: IsADirectoryError")
    assert kids["hidden=16"].data.tags[metrics.TAG_CHECK] == "done"
    assert kids["hidden=16"].data.metrics[metrics.weight_error("max")] < 1e-5
    results = [json.loads(p.read_text()) for p in Path(tmp_path).glob("multirun/**/result.json")]
    assert sorted(r["status"] for r in results) == [0, 0]
    import csv

    with open(next(Path(tmp_path).glob("multirun/*/*/report/points.csv"))) as f:
        rows = {row["point"]: row for row in csv.DictReader(f)}
    assert (
        rows["hidden=24"]["check"].startswith("failed: IsADirectoryError") and not rows["hidden=24"]["weight_error_max"]
    )
    assert rows["hidden=16"]["check"] == "done" and float(rows["hidden=16"]["weight_error_max"]) < 1e-5


def test_references_share_the_cores_by_the_work_they_have_left(tmp_path, monkeypatch):
    """Three references computing on this host (live processes' markers) split the cores the GPUs
    leave in proportion to their work left; a dead process's marker is cleared and counts for none."""
    monkeypatch.setenv(reference_jobs.CORES_ENV, "15")
    monkeypatch.setattr(reference_jobs, "visible_gpus", lambda: 1)  # one core kept for a GPU's rank: 14 shared
    others = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        folder = tmp_path / reference_jobs.RUNNING
        folder.mkdir()
        host = reference_jobs.socket.gethostname()
        for p, work in zip([*others, dead], (1000, 2000, 9000)):
            (folder / f"{host}.{p.pid}").write_text(str(work))
        with reference_jobs._Running(tmp_path) as mine:
            assert mine.share(4000) == 8  # 14 x 4000 / 7000
            assert not (folder / f"{host}.{dead.pid}").exists()
            (folder / f"{host}.{others[1].pid}").unlink()  # H=1024's reference ended
            assert mine.share(3000) == 10  # 14 x 3000 / 4000
            assert (folder / f"{host}.{os.getpid()}").read_text() == "3000"
        assert not (folder / f"{host}.{os.getpid()}").exists()
    finally:
        for p in others:
            p.kill()
            p.wait()


def test_the_weight_errors_figure_is_drawn_once_its_check_lands_and_only_then(mlflow_uri, tmp_path):
    """A sweep whose every point has trained while a check still computes draws its report's other
    figures then (the held point's run FINISHED, its check pending); the weight error's waits for
    the held check (1.5 s, past the one-second grace an earlier version gave it before drawing it
    without that error), is drawn once the check lands, by the early report's second thread, and
    not again by the sweep's own report, which keeps the others and carries every error."""
    # Two ranks: their sum's order is not the sequential reference's, so the errors are not 0 (a figure).
    point = ["hidden=16", "nproc=2", *FAST, f"check.cache_dir={tmp_path / 'refs'}", "lr=0.5"]
    lock = hold_lock(tmp_path / "refs", reference_key(point))
    cmd = sweeper_command([*point[:-1], "lr=0.05,0.5"], figures=True)  # the held point last
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        drawn = wait_for(lambda: next(tmp_path.glob("multirun/*/*/report/convergence.png"), None), proc=proc)
        assert proc.poll() is None  # the sweep waits for the held check
        kids = [r for r in runs(mlflow_uri) if "mlflow.parentRunId" in r.data.tags]
        held = next(r for r in kids if r.data.params["lr"] == "0.5")
        assert held.info.status == "FINISHED" and held.data.tags[metrics.TAG_CHECK] == "pending"
        time.sleep(1.5)
        assert proc.poll() is None and not (drawn.parent / "weight_error.png").exists()
        mtime = drawn.stat().st_mtime_ns
    finally:
        lock.close()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    (folder,) = tmp_path.glob("multirun/*/*")
    timeline = json.loads((folder / "timeline.json").read_text())
    assert "report: figures while the checks land" in [p["phase"] for p in timeline["phases"]]
    t0 = timeline["process_start"]
    late = next(p for p in timeline["phases"] if p["phase"] == "report: the weight error once the checks landed")
    landed = (folder / "1" / queue_files.RESULT).stat().st_mtime - t0
    figure = (folder / "report" / "weight_error.png").stat().st_mtime - t0
    assert landed - 0.01 <= late["start_s"] and figure <= late["end_s"] + 0.01, (landed, late, figure)
    assert drawn.stat().st_mtime_ns == mtime  # the training's figures not drawn again
    rows = list(csv.DictReader((folder / "report" / "points.csv").read_text().splitlines()))
    assert len(rows) == 2 and all(r["check"] == "done" and r["weight_error_max"] != "" for r in rows), rows
    kids = [r for r in runs(mlflow_uri) if "mlflow.parentRunId" in r.data.tags]
    assert {r.info.status for r in kids} == {"FINISHED"} and len(kids) == 2
    assert {r.data.tags[metrics.TAG_CHECK] for r in kids} == {"done"}
    assert all(metrics.weight_error("max") in r.data.metrics for r in kids)
