"""Whole runs on real MPI ranks (mpiexec) recorded in a real, temporary MLflow store."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import MPIEXEC, NO_TIMING_FLOOR, ROOT, compose
from trainer import data, metrics
from trainer.core import model
from trainer.core.generic_step import generic
from trainer.core.loop import Schedule, fit
from trainer.ranks.backend import BLAS_THREADS, Backend, usable_cores
from trainer.record import provenance, store, tracking

pytestmark = pytest.mark.mpi


def trainer(args: list[str], cwd: Path, nproc_mpiexec: int | None = None, timeout: float = 120):
    cmd = [sys.executable, "-m", "trainer", *args]
    if nproc_mpiexec is not None:
        cmd = [MPIEXEC, "-n", str(nproc_mpiexec), *cmd]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=os.environ)


def only_run(uri: str, experiment: str = "sweepscale"):
    client = store.client(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def final_weights(client, run) -> np.ndarray:
    path = client.download_artifacts(run.info.run_id, "weights_final.npz")
    with np.load(path) as f:
        return np.concatenate([f[name].ravel() for name in model.NAMES])


# 57 samples in batches of 7: eight full batches and a last one of a single sample, so with
# 2 or 3 ranks the splits are uneven and some ranks get no sample of the last batch. Pixels in
# [0, 1] and fan-in weights, the CPU check after the whole run.
COMMON = [
    *("dtype=float64", "batch_size=7", "data.n_train=57", "epochs=2", "lr=0.3", "hidden=16", "save.weights=true"),
    *("model.init=fan_in", "data.scale=unit", "check.steps=all"),
    *NO_TIMING_FLOOR,
]


# 3 ranks split the last batch of one sample unevenly, as 2 would (a rank gets none of it), and more ways.
@pytest.mark.parametrize(("nproc", "shuffle"), [(1, False), (3, False), (3, True)])
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
    init = model.init_params(layout, 0, "float64")
    expected = fit(generic(np, layout, init), np, init, ds.x_train, ds.y_train, Schedule(7, 0.3, 1e-4, 2, shuffle, 0))
    got = final_weights(client, run)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-12


def test_run_lands_with_every_metric(idx_dir, mlflow_uri, tmp_path, monkeypatch):
    for key in BLAS_THREADS:  # the ranks' own choice (tests/conftest.py sets one thread for the suite)
        monkeypatch.delenv(key, raising=False)
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
        metrics.BYTES_PCI,
        metrics.BYTES_MPI,
        metrics.ARITHMETIC_INTENSITY,
        metrics.BATCH_MS_REPEAT,
        *(metrics.phase_quantile(p, w) for p in metrics.PHASES for w in ("q1", "q3")),
    ]
    assert sorted(set(expected) - set(m)) == []
    for phase in metrics.PHASES:
        q1, median, q3 = (m[k] for k in (metrics.phase_quantile(phase, "q1"), metrics.phase_time(phase),
                                          metrics.phase_quantile(phase, "q3")))  # fmt: skip
        assert 0 <= q1 <= median <= q3
    # The course's bytes per rank and batch (CPU: nothing over PCIe; 2 ranks: 2b over MPI), and the
    # FLOPs of rank 0's 4 rows of 7 over them.
    assert m[metrics.BYTES_PCI] == 0
    assert m[metrics.BYTES_MPI] == 2 * (16 * 784 + 16 + 10 * 16 + 10) * 8
    assert m[metrics.ARITHMETIC_INTENSITY] == pytest.approx((4 * 4 * 16 * 784 + 6 * 4 * 16 * 10) / (2 * 12730 * 8))
    repeats = sorted((x.step, x.value) for x in client.get_metric_history(run.info.run_id, metrics.BATCH_MS_REPEAT))
    assert [step for step, _ in repeats] == [0, 1, 2]  # perf.repeats=3: the point's time is their median
    assert m[metrics.phase_time("batch")] == sorted(v for _, v in repeats)[1]
    assert (m[metrics.BATCH_MS_LO], m[metrics.BATCH_MS_HI]) == (min(v for _, v in repeats), max(v for _, v in repeats))
    assert 0 <= m[metrics.phase_time("wait")] <= m[metrics.phase_time("skew")] + 1e-9  # 2 ranks: the sum split
    assert metrics.UTILIZATION not in m  # a CPU has no datasheet peak
    assert run.data.tags["sweepscale.world_size"] == "2"
    # Its 2 ranks share this machine's cores for their BLAS threads (each its own count otherwise)
    assert run.data.tags[metrics.TAG_BLAS_THREADS] == str(max(1, usable_cores() // 2))
    assert m[metrics.FLOPS_PER_BATCH] == 4 * 7 * 16 * 784 + 6 * 7 * 16 * 10
    assert m[metrics.ALLREDUCE_BYTES] == (16 * 784 + 16 + 10 * 16 + 10 + 1) * 8
    losses = client.get_metric_history(run.info.run_id, metrics.TRAIN_LOSS)
    assert sorted(x.step for x in losses) == list(range(18))  # 9 batches x 2 epochs
    assert [x.step for x in client.get_metric_history(run.info.run_id, metrics.TEST_PRECISION)] == [1, 2]
    p = run.data.params
    assert p["hidden"] == "16" and p["data.dir"] == str(idx_dir) and p["dtype"] == "float64"
    assert p["perf.repeats"] == "3"
    assert not [k for k in p if k.startswith("mlflow.")]  # where the run is recorded is no param
    tags = run.data.tags
    assert tags[metrics.TAG_VERSION] == importlib.metadata.version("sweepscale")
    assert tags[metrics.TAG_GIT_COMMIT] == git("rev-parse", "HEAD").strip()
    assert tags[metrics.TAG_GIT_DIRTY] == str(bool(git("status", "--porcelain").strip())).lower()
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags[metrics.TAG_EXPERIMENT_KIND] == metrics.EXPERIMENT_KIND
    from mpi4py import MPI

    assert run.data.tags[metrics.TAG_CONFIG_HASH]
    assert run.data.tags["sweepscale.mpi_library"] == MPI.Get_library_version().strip().splitlines()[0]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "weights_initial.npz", "weights_final.npz"} <= artifacts
    with np.load(client.download_artifacts(run.info.run_id, "weights_initial.npz")) as f:
        np.testing.assert_array_equal(
            f["W1"], model.Layout(784, 16).views(model.init_params(model.Layout(784, 16), 0, "float64")).W1
        )


def test_time_to_first_batch_is_logged_in_the_experiment_the_environment_names(
    idx_dir, mlflow_uri, tmp_path, monkeypatch
):
    """From the process's start to its first batch: positive, and within the process's wall time;
    the run in MLFLOW_EXPERIMENT_NAME's experiment, without a weight error (no reference asked)."""
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    t0 = time.time()
    # One rank: the run is created beside training.
    result = trainer([*COMMON, f"data.dir={idx_dir}", "check.reference=false"], tmp_path)
    wall = time.time() - t0
    assert result.returncode == 0, result.stderr
    _, run = only_run(mlflow_uri, "from-env")
    assert 0 < run.data.metrics[metrics.TIME_TO_FIRST_BATCH] < wall
    assert run.info.start_time / 1e3 <= t0 + wall and run.data.params["hidden"] == "16"
    assert metrics.weight_error("max") not in run.data.metrics


def test_reference_is_cached_across_nproc(idx_dir, mlflow_uri, tmp_path):
    for nproc in (1, 2):
        assert trainer([*COMMON, f"nproc={nproc}", f"data.dir={idx_dir}"], tmp_path).returncode == 0
    client = store.client(mlflow_uri)
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


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_sigterm_a_library_swallowed_still_ends_the_run_killed_at_its_epochs_end(nproc, mlflow_uri, tmp_path):
    """A SIGTERM whose exception a bare ``except:`` swallowed (Cython's module init did, while
    numpy.random imported, and a warm worker trained its point to the end): the epoch it came in
    is recorded whole, then the run ends KILLED; with two ranks, the rank that lost it ends the world."""
    args = [*COMMON, "epochs=50", f"nproc={nproc}", "fault.kind=lost_sigterm", f"fault.rank={nproc - 1}"]
    result = trainer([*args, "fault.iteration=3", "check.reference=false"], tmp_path, timeout=60)
    assert result.returncode != 0, result.stdout + result.stderr
    client, run = only_run(mlflow_uri)
    assert run.info.status == "KILLED", run.data.tags.get(metrics.TAG_ERROR)
    assert "terminated by SIGTERM" in run.data.tags[metrics.TAG_ERROR]
    assert 'File "' not in run.data.tags[metrics.TAG_ERROR]  # #47: its cause in a line, no traceback's fragment
    epochs = [m.step for m in client.get_metric_history(run.info.run_id, metrics.TRAIN_LOSS_EPOCH)]
    # 9 batches an epoch: the first is recorded by the rank that lost it; with 2 ranks rank 0 may have been ended first
    assert epochs == [1] if nproc == 1 else epochs in ([], [1]), epochs


def test_world_size_must_equal_nproc(tmp_path, mlflow_uri):
    result = trainer(["nproc=3", "epochs=1"], tmp_path, nproc_mpiexec=2)
    assert result.returncode != 0
    assert "nproc=3 but this MPI world has 2 ranks: start it with `mpiexec -n 3` or set nproc=2" in result.stderr


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.dir=missing", "data.dir=missing: no such folder"),
        ("check.cache_dir=/proc/sweepscale", "check.cache_dir=/proc/sweepscale: cannot write there"),
        ("mlflow.experiment=" + "x" * 600, "mlflow.experiment: 600 characters, MLflow takes at most 500"),
    ],
    ids=["data", "cache", "experiment"],
)
def test_bad_input_fails_before_any_rank_starts(override, message, tmp_path, mlflow_uri):
    result = trainer(["nproc=2", override], tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "mlflow.db").exists()  # nothing half-written


@pytest.mark.parametrize(("override", "key"), [("gpu.step=fused", "gpu.step"), ("gpu.comm=nccl", "gpu.comm")])
def test_gpu_only_choices_on_the_cpu_are_clear_errors(override, key, tmp_path, mlflow_uri):
    result = trainer([override, "device=cpu", "nproc=2"], tmp_path)
    assert result.returncode == 2
    assert f"{override} needs a GPU and none is used here; set {key}=auto" in result.stderr


def test_a_run_shorter_than_the_floor_times_extra_steps_and_keeps_its_weights(idx_dir, mlflow_uri, tmp_path):
    """COMMON trains 2 epochs of 9 batches; the first is warm-up, left out. With a floor of 3 repeats
    of 12 batches, both ranks time extra steps after training, on a scratch copy of the weights: the
    same weights, losses and reference check as a run whose 9 timed batches met its floor."""
    runs = {}
    for name, floor in {"short": "perf.min_batches=12", "met": "perf.min_batches=3"}.items():
        args = [*COMMON, "nproc=2", f"data.dir={idx_dir}", "perf.min_seconds=0", floor, f"mlflow.experiment={name}"]
        result = trainer(args, tmp_path)
        assert result.returncode == 0, result.stderr
        runs[name] = only_run(mlflow_uri, name)
    (client, short), (_, met) = runs["short"], runs["met"]

    def history(run, key):
        return [
            (x.step, x.value) for x in sorted(client.get_metric_history(run.info.run_id, key), key=lambda x: x.step)
        ]

    m = short.data.metrics
    assert m[metrics.TIMED_BATCHES] == m[metrics.EXTRA_STEPS] >= 3 * 12  # the pass's batches, past its own warm-up
    repeats = history(short, metrics.BATCH_MS_REPEAT)
    assert [step for step, _ in repeats] == [0, 1, 2] and all(ms > 0 for _, ms in repeats)
    assert m[metrics.BATCH_MS_LO] == min(ms for _, ms in repeats) <= m[metrics.phase_time("batch")]
    assert m[metrics.phase_time("batch")] <= m[metrics.BATCH_MS_HI] == max(ms for _, ms in repeats)
    # Two ranks: the all-reduce split into the sum itself and the waits for the slowest rank.
    assert 0 <= m[metrics.phase_time("wait")] <= m[metrics.phase_time("allreduce")] + 1e-9
    assert m[metrics.phase_time("skew")] >= 0 and m[metrics.phase_time("sum")] >= 0
    # Training met the floor: its second epoch's batches, and no extra step.
    assert (met.data.metrics[metrics.TIMED_BATCHES], met.data.metrics[metrics.EXTRA_STEPS]) == (9, 0)
    np.testing.assert_array_equal(final_weights(client, short), final_weights(client, met))
    assert history(short, metrics.TRAIN_LOSS) == history(met, metrics.TRAIN_LOSS)
    assert short.data.metrics[metrics.weight_error("max")] == met.data.metrics[metrics.weight_error("max")]


def test_repeats_below_one_are_refused(tmp_path, mlflow_uri):
    result = trainer(["perf.repeats=0", "epochs=1"], tmp_path)
    assert result.returncode == 2
    assert "perf.repeats=0: the batches are timed in at least one repeat" in result.stderr


def performance_run(mlflow_uri: str, overrides: list[str], device_name: str, batch_ms: float):
    """record_performance on a real store for a GPU run at H=2048, B=3200 that took batch_ms a batch."""
    from trainer.options import StepOptions
    from trainer.record.run_record import record_performance

    cfg = compose(["hidden=2048", "batch_size=3200", *overrides])
    recorder = tracking.Recorder(mlflow_uri, "perf", None, {})
    backend = Backend(np, "gpu", device_name)
    phase_ms = {"forward": batch_ms / 2, "backward": batch_ms / 2, "batch": batch_ms}
    options = StepOptions(kind="fused", gemm=cfg.gpu.gemm.value, x_levels=255)  # bf16x3: 3 products
    record_performance(recorder, cfg, model.Layout(784, 2048), backend, phase_ms, 1, options=options, comm="nccl",
                       n_train=38400)  # fmt: skip
    recorder.finish()
    return store.client(mlflow_uri).get_run(recorder.run_id)


def test_utilization_divides_by_the_peak_of_the_arithmetic_used(mlflow_uri):
    """3xBF16 at H=2048 in 0.168 ms on an H200 (docs/benchmarks.md): over the BF16 tensor cores' peak
    for three products, not over FP32's (which read 1.84)."""
    run = performance_run(mlflow_uri, ["gpu.gemm=bf16x3"], "NVIDIA H200", 0.168)
    m, tags = run.data.metrics, run.data.tags
    tflops = (4 * 3200 * 2048 * 784 + 6 * 3200 * 2048 * 10) / 0.168e-3 / 1e12
    assert m[metrics.TFLOPS] == pytest.approx(tflops)
    assert m[metrics.UTILIZATION] == pytest.approx(tflops / (989.5 / 3))
    assert m[metrics.UTILIZATION] < 0.4
    assert float(tags[metrics.TAG_PEAK_TFLOPS]) == pytest.approx(989.5 / 3)
    assert tags[metrics.TAG_PEAK_ARITHMETIC] == "BF16 tensor cores / 3 products"
    assert metrics.TAG_UTILIZATION_ERROR not in tags
    # On the GPU with the data on it and one rank, nothing crosses PCIe or MPI: no finite intensity.
    assert m[metrics.BYTES_PCI] == m[metrics.BYTES_MPI] == 0
    assert metrics.ARITHMETIC_INTENSITY not in m


def test_utilization_above_one_is_never_logged(mlflow_uri):
    """A configured peak below what the run reached (the FP32 peak for 3xBF16) is a wrong peak:
    no utilization, and a tag that says why."""
    run = performance_run(mlflow_uri, ["gpu.gemm=bf16x3", "perf.peak_tflops=67"], "NVIDIA H200", 0.168)
    assert metrics.UTILIZATION not in run.data.metrics
    error = run.data.tags[metrics.TAG_UTILIZATION_ERROR]
    assert "would be 1.86 of the peak, 67 TFLOP/s per device" in error
    assert "that peak is wrong for this arithmetic" in error
    assert run.data.tags[metrics.TAG_PEAK_ARITHMETIC] == "perf.peak_tflops (the GEMMs: BF16 tensor cores / 3 products)"


def test_new_and_old_experiments_open_on_the_runs_table(mlflow_uri):
    """MLflow 3's UI opens an experiment on its runs table when its kind tag says custom model
    development: new experiments get it, old ones without it too, a kind set by hand stays."""
    client = store.client(mlflow_uri)
    kind = metrics.TAG_EXPERIMENT_KIND
    new = store.ensure_experiment(client, mlflow_uri, "new")
    assert client.get_experiment(new).tags[kind] == "custom_model_development"
    old = client.create_experiment("old")  # as an earlier version made them
    assert kind not in client.get_experiment(old).tags
    assert store.ensure_experiment(client, mlflow_uri, "old") == old
    assert client.get_experiment(old).tags[kind] == "custom_model_development"
    genai = client.create_experiment("genai", tags={kind: "genai_development"})
    assert store.ensure_experiment(client, mlflow_uri, "genai") == genai
    assert client.get_experiment(genai).tags[kind] == "genai_development"


def test_code_tags_outside_a_git_checkout(tmp_path, monkeypatch):
    """A copy of the package outside any checkout: the version, no git tags; without installed
    metadata, pyproject's version."""
    shutil.copytree(ROOT / "trainer", tmp_path / "pkg" / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    code = "from trainer.record import provenance; print(sorted(provenance.code_tags().items()))"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkg")}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str([(metrics.TAG_VERSION, importlib.metadata.version("sweepscale"))])
    monkeypatch.setattr(provenance, "DISTRIBUTION", "not-installed-anywhere")
    assert provenance.package_version() == "0.1.0"  # pyproject.toml's


@pytest.mark.parametrize(("divergence", "status"), [("stop", "FAILED"), ("go_on", "FINISHED")])
def test_a_diverging_run_stops_at_its_first_non_finite_loss(divergence, status, mlflow_uri, tmp_path):
    args = ["dtype=float64", "batch_size=10", "data.n_train=100", "epochs=3", "hidden=16", "lr=1e30"]
    result = trainer([*args, "check.reference=false", f"check.divergence={divergence}"], tmp_path)
    assert result.returncode == (1 if status == "FAILED" else 0), result.stderr
    client, run = only_run(mlflow_uri)
    assert run.info.status == status
    losses = [m.value for m in client.get_metric_history(run.info.run_id, metrics.TRAIN_LOSS)]
    # MLflow stores an infinite value as the largest float
    first_bad = next(i for i, v in enumerate(losses) if not np.isfinite(v) or abs(v) >= np.finfo(np.float64).max)
    if status == "FAILED":
        assert f"diverged at step {first_bad} (epoch 1)" in run.data.tags[metrics.TAG_ERROR]
        assert len(losses) == 10  # the epoch's curve is recorded, NaN included; no later epoch ran
        assert "DivergedError: diverged at step" in result.stderr and "Traceback" not in result.stderr  # #47
    else:
        assert len(losses) == 30


def test_a_rank_killed_in_a_standalone_run_ends_it_failed_with_the_cause(mlflow_uri, tmp_path):
    """SIGKILL of rank 1 (fault.kind=kill): no rank can end the run; the launching process does."""
    args = [*COMMON, "nproc=2", "fault.kind=kill", "fault.rank=1", "fault.iteration=2", "check.reference=false"]
    result = trainer(args, tmp_path)
    assert result.returncode != 0
    _, run = only_run(mlflow_uri)
    assert run.info.status == "FAILED"
    assert "a rank died before the run ended: mpiexec exited with status" in run.data.tags[metrics.TAG_ERROR]
    assert "SIGKILL" in run.data.tags[metrics.TAG_ERROR]


def test_local_ranks_listen_on_loopback_only():
    """A local run's ranks (mpiexec on one host) accept connections on 127.0.0.1 alone, not on the
    machine's other addresses (tests/listening.py reads each rank's listening sockets from /proc)."""
    from trainer.ranks import parallel

    cmd = [parallel.find_mpiexec(None), "-n", "2", sys.executable, str(ROOT / "tests" / "listening.py")]
    out = subprocess.run(cmd, env=parallel.mpiexec_env(), capture_output=True, text=True, timeout=60)
    rows = [line.split()[2:] for line in out.stdout.splitlines() if line.startswith("listening")]
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 as /proc/net/tcp{,6} write them
    assert len(rows) == 2, out.stdout + out.stderr  # a rank may listen nowhere (Open MPI on one host)
    assert {addr for row in rows for addr in row} <= loopback, rows


def test_a_two_rank_run_records_twice_its_wall_time_as_core_seconds(mlflow_uri, tmp_path, monkeypatch):
    """#35: a run's device-seconds (core-seconds on CPU ranks, GPU-seconds on GPUs) are its ranks x
    the seconds it held them; the training part is ranks x its epochs' time, which the run records
    too. Real ranks (mpiexec, nproc=2), given their BLAS threads by the environment."""
    args = ["nproc=2", "epochs=3", "hidden=32", "batch_size=50", "data.n_train=400", "data.n_test=50"]
    cores = usable_cores()
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", str(cores))  # the user's say: the ranks keep it
    result = trainer([*args, "check.reference=false"], tmp_path)
    assert result.returncode == 0, result.stderr
    client, run = only_run(mlflow_uri)
    assert run.data.tags[metrics.TAG_BLAS_THREADS] == str(cores)
    m = run.data.metrics
    epochs_s = sum(x.value for x in client.get_metric_history(run.info.run_id, metrics.EPOCH_TIME))
    assert m[metrics.device_seconds("cpu", training=True)] == pytest.approx(2 * epochs_s, rel=1e-9)
    span_s = (run.info.end_time - run.info.start_time) / 1000  # the run's whole life in MLflow
    held_s = m[metrics.device_seconds("cpu")] / 2
    assert epochs_s <= held_s <= span_s, (epochs_s, held_s, span_s)
    assert metrics.device_seconds("gpu") not in m  # no GPU was held


def test_the_trainer_refuses_a_multirun(tmp_path, mlflow_uri):
    # Under Hydra's multirun each of its ranks (mpiexec re-runs the command) would sweep on its own.
    result = trainer(["-m", "lr=0.1,0.2", "nproc=2", "device=cpu"], tmp_path)
    assert result.returncode == 2 and "runs one config; sweep with python -m sweeper -m" in result.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "multirun").exists()
