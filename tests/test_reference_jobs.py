"""The CPU reference beside the run (trainer/reference_jobs.py): real runs, real spawned children."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.test_sweeper import FAST, children_of, parents, sweep
from tests.test_trainer_runs import COMMON, final_weights, only_run, trainer
from trainer import data, metrics, model, reference, reference_jobs
from trainer.loop import Schedule

pytestmark = pytest.mark.mpi

LAYOUT = model.Layout(D=784, H=16)
SCHEDULE = Schedule(7, 0.3, 1e-4, 2, False, 0)  # COMMON's


def key_of(ds: data.Dataset) -> str:
    return reference.cache_key(LAYOUT, SCHEDULE, "float64", 0, ds.fingerprint(), init="fan_in", scale="unit")


def test_the_check_beside_logs_what_the_synchronous_check_gave(idx_dir, mlflow_uri, tmp_path):
    """The error logged once the child's reference is there is the one the in-process computation gives."""
    cache = tmp_path / "cache"
    result = trainer([*COMMON, f"data.dir={idx_dir}", f"check.cache_dir={cache}"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "max weight error vs CPU" in result.stdout
    client, run = only_run(mlflow_uri)
    assert run.info.status == "FINISHED"
    ds = data.load(str(idx_dir), 57, None, "float64")
    init = model.init_params(LAYOUT, 0, "float64")
    sync, cached = reference.reference_params(LAYOUT, init, ds.x_train, ds.y_train, SCHEDULE, tmp_path / "sync", "k")
    assert not cached
    expected = reference.relative_errors(LAYOUT, final_weights(client, run), sync)
    got = {k: run.data.metrics[metrics.weight_error(k)] for k in metrics.WEIGHT_ERROR_KEYS}
    assert got == {k: expected[k] for k in metrics.WEIGHT_ERROR_KEYS} and got["max"] < 1e-12
    assert run.data.tags["sweepscale.reference"] == "computed"
    assert run.data.tags["sweepscale.reference_key"] == key_of(ds)
    np.testing.assert_array_equal(np.load(cache / f"{key_of(ds)}.npy"), sync)


def test_a_cached_reference_needs_no_process(idx_dir, tmp_path):
    ds = data.load(str(idx_dir), 57, None, "float64")
    weights = np.arange(LAYOUT.size, dtype=np.float64)
    np.save(tmp_path / f"{key_of(ds)}.npy", weights)
    spec = reference_jobs.DataSpec(str(idx_dir), 57, None, "float64", "unit")
    init = model.init_params(LAYOUT, 0, "float64")
    job = reference_jobs.submit(spec, ds.fingerprint, lambda f: key_of(ds), LAYOUT, init, SCHEDULE, tmp_path)
    ref = job.result(timeout=60)
    assert ref.cached and ref.key == key_of(ds)
    np.testing.assert_array_equal(ref.params, weights)
    assert reference_jobs._pool is None  # read here: no child started


SUBMIT = """
import sys, time
import numpy as np
from trainer import data, model, reference, reference_jobs
from trainer.loop import Schedule
idx_dir, cache, out = sys.argv[1:]
layout, schedule = model.Layout(D=784, H=16), Schedule(7, 0.3, 1e-4, 2, False, 0)
ds = data.load(idx_dir, 57, None, "float64")
def key(fingerprint):
    return reference.cache_key(layout, schedule, "float64", 0, fingerprint, init="fan_in", scale="unit")
spec = reference_jobs.DataSpec(idx_dir, 57, None, "float64", "unit")
job = reference_jobs.submit(spec, ds.fingerprint, key, layout, model.init_params(layout, 0, "float64"), schedule, cache)
while reference_jobs._pool is None:  # the cache had no file: the child is asked for it
    time.sleep(0.05)
print("submitted", flush=True)
ref = job.result()
np.save(out, ref.params)
print("cached" if ref.cached else "computed", flush=True)
"""


def test_two_processes_needing_one_reference_compute_it_once(idx_dir, tmp_path):
    """Two ranks 0 ask for one key with a fresh cache while its lock is held: once it is free, one
    child computes, the other waits for it and reads its file."""
    cache = tmp_path / "cache"
    cache.mkdir()
    ds = data.load(str(idx_dir), 57, None, "float64")
    with open(cache / f"{key_of(ds)}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # both children reach the lock before either computes
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
        assert not (cache / f"{key_of(ds)}.npy").exists()
    said = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert [p.returncode for p in procs] == [0, 0]
    assert said == ["cached", "computed"]
    a, b = np.load(tmp_path / "out0.npy"), np.load(tmp_path / "out1.npy")
    np.testing.assert_array_equal(a, b)
    assert sorted(f.name for f in cache.iterdir()) == [f"{key_of(ds)}.lock", f"{key_of(ds)}.npy"]


def block_reference(cache: Path, overrides: list[str]) -> None:
    """Make the reference of this config fail after training: its lock file's path is a folder."""
    from tests.conftest import compose
    from trainer.run import load_data, schedule_of

    cfg = compose(overrides)
    ds = load_data(cfg)
    layout = model.Layout(D=ds.n_features, H=cfg.hidden)
    key = reference.cache_key(
        layout, schedule_of(cfg), cfg.dtype.value, cfg.seed, ds.fingerprint(), init="fan_in", scale="unit"
    )
    (cache / f"{key}.lock").mkdir(parents=True)


def test_a_failing_reference_ends_the_run_failed(idx_dir, mlflow_uri, tmp_path):
    args = [*COMMON, f"data.dir={idx_dir}", f"check.cache_dir={tmp_path / 'cache'}"]
    block_reference(tmp_path / "cache", args)
    result = trainer(args, tmp_path)
    assert result.returncode == 1
    _, run = only_run(mlflow_uri)
    assert run.info.status == "FAILED"
    assert "IsADirectoryError" in run.data.tags[metrics.TAG_ERROR]
    assert metrics.weight_error("max") not in run.data.metrics
    assert run.data.metrics[metrics.TRAIN_LOSS_EPOCH] > 0  # the training itself was recorded


def test_a_warm_worker_writes_the_result_after_the_run_ended(mlflow_uri, tmp_path):
    """A point whose reference fails ends FAILED in a warm worker, which goes on serving; no run is
    left RUNNING once its result.json exists."""
    cache = tmp_path / "cache"
    block_reference(cache, ["hidden=24", *FAST])
    args = ["hidden=16,24", f"check.cache_dir={cache}", *FAST, "launcher.cpus=1"]
    result = sweep(args, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    (parent,) = parents(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id)
    status = {name: r.info.status for name, r in kids.items()}
    assert status == {"hidden=16": "FINISHED", "hidden=24": "FAILED"}
    assert len({r.data.tags[metrics.TAG_WORKER] for r in kids.values()}) == 1  # one worker served both
    for name, r in kids.items():
        if status[name] == "FAILED":
            assert "IsADirectoryError" in r.data.tags[metrics.TAG_ERROR]
        else:
            assert r.data.tags["sweepscale.reference"] == "computed"
            assert r.data.metrics[metrics.weight_error("max")] < 1e-5
    results = [json.loads(p.read_text()) for p in Path(tmp_path).glob("multirun/**/result.json")]
    assert sorted(r["status"] for r in results) == [0, 1]
