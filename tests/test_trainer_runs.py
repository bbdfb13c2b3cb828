"""Whole runs on real MPI ranks (mpiexec) recorded in a real, temporary MLflow store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MPIEXEC
from trainer import data, metrics, model
from trainer.loop import Schedule, fit

pytestmark = pytest.mark.mpi


def trainer(args: list[str], cwd: Path, nproc_mpiexec: int | None = None, timeout: float = 120):
    cmd = [sys.executable, "-m", "trainer", *args]
    if nproc_mpiexec is not None:
        cmd = [MPIEXEC, "-n", str(nproc_mpiexec), *cmd]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=os.environ)


def only_run(uri: str, experiment: str = "sweepscale"):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def final_weights(client, run) -> np.ndarray:
    path = client.download_artifacts(run.info.run_id, "weights_final.npz")
    with np.load(path) as f:
        return np.concatenate([f[name].ravel() for name in model.NAMES])


# 57 samples in batches of 7: eight full batches and a last one of a single sample, so with
# 2 or 3 ranks the splits are uneven and some ranks get no sample of the last batch.
COMMON = ["dtype=float64", "batch_size=7", "data.n_train=57", "epochs=2", "lr=0.3", "hidden=16", "save.weights=true"]


@pytest.mark.parametrize(("nproc", "shuffle"), [(1, False), (2, False), (3, False), (3, True)])
def test_ranks_match_sequential_reference(nproc, shuffle, idx_dir, mlflow_uri, tmp_path):
    args = [*COMMON, f"nproc={nproc}", f"data.dir={idx_dir}", f"data.shuffle={str(shuffle).lower()}"]
    result = trainer(args, tmp_path, nproc_mpiexec=nproc)
    assert result.returncode == 0, result.stderr
    client, run = only_run(mlflow_uri)
    assert run.info.status == "FINISHED"
    assert run.data.tags["sweepscale.world_size"] == str(nproc)
    assert run.data.metrics[metrics.weight_error("max")] < 1e-12
    # And against a sequential run computed here, independently of the trainer's own check.
    ds = data.load(str(idx_dir), 57, None, "float64")
    layout = model.Layout(D=784, H=16)
    expected = fit(
        np,
        layout,
        model.init_params(layout, 0, "float64"),
        ds.x_train,
        ds.y_train,
        Schedule(7, 0.3, 1e-4, 2, shuffle, 0),
    )
    got = final_weights(client, run)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-12


def test_run_lands_with_every_metric(idx_dir, mlflow_uri, tmp_path):
    result = trainer([*COMMON, "nproc=2", f"data.dir={idx_dir}"], tmp_path)  # no mpiexec: it starts its own
    assert result.returncode == 0, result.stderr
    client, run = only_run(mlflow_uri)
    m = run.data.metrics
    expected = [
        metrics.TRAIN_LOSS,
        metrics.TRAIN_LOSS_EPOCH,
        metrics.TEST_PRECISION,
        metrics.EPOCH_TIME,
        *(metrics.weight_error(k) for k in metrics.WEIGHT_ERROR_KEYS),
        *(metrics.phase_time(p) for p in metrics.PHASES),
        metrics.SAMPLES_PER_S,
        metrics.TFLOPS,
        metrics.ALLREDUCE_GBPS,
        metrics.FLOPS_PER_BATCH,
        metrics.ALLREDUCE_BYTES,
    ]
    assert sorted(set(expected) - set(m)) == []
    assert run.data.tags["sweepscale.world_size"] == "2"
    assert m[metrics.FLOPS_PER_BATCH] == 4 * 7 * 16 * 784 + 6 * 7 * 16 * 10
    assert m[metrics.ALLREDUCE_BYTES] == (16 * 784 + 16 + 10 * 16 + 10 + 1) * 8
    losses = client.get_metric_history(run.info.run_id, metrics.TRAIN_LOSS)
    assert sorted(x.step for x in losses) == list(range(18))  # 9 batches x 2 epochs
    assert [x.step for x in client.get_metric_history(run.info.run_id, metrics.TEST_PRECISION)] == [1, 2]
    p = run.data.params
    assert p["hidden"] == "16" and p["data.dir"] == str(idx_dir) and p["dtype"] == "float64"
    from mpi4py import MPI

    assert run.data.tags[metrics.TAG_CONFIG_HASH]
    assert run.data.tags["sweepscale.mpi_library"] == MPI.Get_library_version().strip().splitlines()[0]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "weights_initial.npz", "weights_final.npz"} <= artifacts
    with np.load(client.download_artifacts(run.info.run_id, "weights_initial.npz")) as f:
        np.testing.assert_array_equal(
            f["W1"], model.Layout(784, 16).views(model.init_params(model.Layout(784, 16), 0, "float64")).W1
        )


def test_experiment_from_environment(idx_dir, mlflow_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    result = trainer([*COMMON, f"data.dir={idx_dir}", "check.reference=false"], tmp_path)
    assert result.returncode == 0, result.stderr
    _, run = only_run(mlflow_uri, "from-env")
    assert metrics.weight_error("max") not in run.data.metrics


def test_reference_is_cached_across_nproc(idx_dir, mlflow_uri, tmp_path):
    for nproc in (1, 2):
        assert trainer([*COMMON, f"nproc={nproc}", f"data.dir={idx_dir}"], tmp_path).returncode == 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("sweepscale").experiment_id], order_by=["start_time"])
    assert [r.data.tags["sweepscale.reference"] for r in runs] == ["computed", "cached"]


def test_failing_rank_aborts_world_and_marks_run_failed(idx_dir, mlflow_uri, tmp_path):
    args = [*COMMON, "nproc=2", f"data.dir={idx_dir}", "fault.rank=1", "fault.iteration=3"]
    result = trainer(args, tmp_path, timeout=60)  # a hang would time out here
    assert result.returncode != 0
    assert "fault injected on rank 1 at iteration 3" in result.stderr
    client, run = only_run(mlflow_uri)
    assert run.info.status == "FAILED"
    assert "InjectedFaultError" in run.data.tags[metrics.TAG_ERROR]
    text = Path(client.download_artifacts(run.info.run_id, "error-rank1.txt")).read_text()
    assert "Traceback" in text


def test_world_size_must_equal_nproc(tmp_path, mlflow_uri):
    result = trainer(["nproc=3", "epochs=1"], tmp_path, nproc_mpiexec=2)
    assert result.returncode != 0
    assert "nproc=3 but this MPI world has 2 ranks: start it with `mpiexec -n 3` or set nproc=2" in result.stderr


def test_bad_input_fails_before_any_rank_starts(tmp_path, mlflow_uri):
    result = trainer(["nproc=2", f"data.dir={tmp_path / 'missing'}"], tmp_path)
    assert result.returncode == 2
    assert f"data.dir={tmp_path / 'missing'}: no such folder" in result.stderr
    assert not (tmp_path / "mlflow.db").exists()  # nothing half-written


@pytest.mark.parametrize(("override", "key"), [("step=fused", "step"), ("comm=nccl", "comm")])
def test_gpu_only_choices_on_the_cpu_are_clear_errors(override, key, tmp_path, mlflow_uri):
    result = trainer([override, "device=cpu", "nproc=2"], tmp_path)
    assert result.returncode == 2
    assert f"{override} needs a GPU and none is used here; set {key}=auto" in result.stderr
