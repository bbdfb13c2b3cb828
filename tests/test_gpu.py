"""The CuPy path against the NumPy path, and whole runs on GPUs (marked gpu: `make test-gpu`)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import gpu_available
from tests.test_trainer_runs import COMMON, final_weights, only_run, trainer
from trainer import data, metrics, step
from trainer.config import Device
from trainer.core import model
from trainer.core.generic_step import generic
from trainer.core.loop import Schedule, fit
from trainer.errors import ConfigError
from trainer.options import StepOptions
from trainer.ranks.backend import select
from trainer.step import make_step


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "tol"), [("float64", 1e-12), ("float32", 1e-4)])
def test_cupy_training_matches_numpy(dtype, tol):
    import cupy

    ds = data.load(None, 600, None, dtype)
    layout = model.Layout(D=784, H=64)
    schedule = Schedule(batch_size=128, lr=0.05, reg=1e-4, epochs=2, shuffle=True, seed=3)
    init = model.init_params(layout, 0, dtype)
    host, device = init.copy(), cupy.asarray(init)
    cpu = fit(generic(np, layout, host), np, host, ds.x_train, ds.y_train, schedule)
    x, y = cupy.asarray(ds.x_train), cupy.asarray(ds.y_train)
    gpu = fit(generic(cupy, layout, device), cupy, device, x, y, schedule)
    assert np.linalg.norm(gpu.get() - cpu) / np.linalg.norm(cpu) < tol


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("nproc", [1, 2])
def test_gpu_run_is_checked_and_recorded(nproc, idx_dir, mlflow_uri, tmp_path):
    result = trainer([*COMMON, "device=gpu", f"nproc={nproc}", f"data.dir={idx_dir}"], tmp_path)
    assert result.returncode == 0, result.stderr
    _, run = only_run(mlflow_uri)
    assert run.data.tags["sweepscale.device"] == "gpu"
    assert run.data.tags["sweepscale.gemm"] == "dgemm"  # float64: the fused step's GEMMs are DGEMMs
    assert run.data.metrics[metrics.weight_error("max")] < 1e-12  # float64
    assert run.data.metrics[metrics.phase_time("batch")] > 0
    devices = run.data.tags[metrics.TAG_RANK_DEVICES].split("; ")  # each rank on its own GPU, by name
    assert [d.split("=", 1)[0] for d in devices] == [str(r) for r in range(nproc)]
    distinct = min(nproc, cupy_gpus())  # one GPU a rank where there are enough (backend.select: local rank mod GPUs)
    assert all("/gpu" in d and "(NVIDIA" in d for d in devices) and len({d.split("/")[1] for d in devices}) == distinct


def cupy_gpus() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def test_gpu_requested_without_gpu_is_a_clear_error():
    if gpu_available():
        pytest.skip("this machine has a GPU: the error cannot happen here")
    with pytest.raises(ConfigError, match=r"device=gpu but no GPU is usable here .* or set device=cpu"):
        select(Device.gpu, 0)


def gpu_count() -> int:
    from trainer.ranks.backend import gpu_count as count

    return count() if gpu_available() else 0


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "gemm", "x_levels", "shuffle", "tol"),
    [
        ("float64", "sgemm", None, True, 1e-12),
        ("float32", "sgemm", None, True, 1e-5),
        ("float32", "tf32x3", None, True, 1e-5),  # three products
        ("float32", "tf32x3", data.PIXEL_LEVELS, True, 1e-5),  # two: X as its pixels' levels, as the trainer runs it
        ("float32", "tf32x3", data.PIXEL_LEVELS, False, 1e-5),  # in order: X prepared once (FusedStep.prepare)
        ("float32", "bf16x3", data.PIXEL_LEVELS, True, 1e-5),  # three BF16 products
        ("float32", "bf16x3", data.PIXEL_LEVELS, False, 1e-5),
    ],
)
def test_fused_step_matches_generic_step(dtype, gemm, x_levels, shuffle, tol):
    """The fused kernels compute the generic path's function: weights and losses, a last batch
    that fills neither a block of rows nor one of columns (H=300 > 256 threads)."""
    ds = data.load(None, 701, None, dtype)
    schedule = Schedule(batch_size=256, lr=0.2, reg=1e-3, epochs=2, shuffle=shuffle, seed=5)
    assert_fused_matches_generic(model.Layout(D=784, H=300), ds.x_train, ds.y_train, schedule, gemm, x_levels, tol)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "gemm", "D"), [("float32", "sgemm", 30), ("float32", "bf16x3", 30), ("float64", "sgemm", 31)]
)
def test_fused_step_with_rows_of_odd_width(dtype, gemm, D):
    """Inputs whose width D is not a multiple of the update's vector (4 float32s, 2 float64s):
    sgd_update then takes W1 one value at a time, and the fused step still computes the generic
    one's weights. Random pixels k / 255, as bf16x3 needs."""
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, size=(300, D)) / data.PIXEL_LEVELS).astype(dtype)
    y = rng.integers(0, 10, size=300).astype(np.int64)
    schedule = Schedule(batch_size=128, lr=0.2, reg=1e-3, epochs=2, shuffle=False, seed=0)
    tol = 1e-12 if dtype == "float64" else 1e-5
    assert_fused_matches_generic(model.Layout(D=D, H=70), x, y, schedule, gemm, data.PIXEL_LEVELS, tol)


def assert_fused_matches_generic(layout, x_host, y_host, schedule, gemm, x_levels, tol) -> None:
    """Train from the same start with the generic and the fused step: the same weights and losses."""
    import cupy

    x, y = cupy.asarray(x_host), cupy.asarray(y_host)
    results = {}
    for kind in ("generic", "fused"):
        losses = []
        params = cupy.asarray(model.init_params(layout, 1, str(x_host.dtype)))
        options = StepOptions(kind=kind, gemm=gemm, x_levels=x_levels)
        taken = step.build(options, cupy, layout, params, schedule.batch_size)
        fit(taken, cupy, params, x, y, schedule, on_epoch=lambda e, out=losses: out.append(e.losses))
        results[kind] = (params.get(), np.concatenate(losses))
    (pg, lg), (pf, lf) = results["generic"], results["fused"]
    assert np.linalg.norm(pf - pg) / np.linalg.norm(pg) < tol
    np.testing.assert_allclose(lf, lg, rtol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize(("warps", "samples"), [(32, 32), (32, 16), (16, 16)])
def test_output_layer_block_shapes(warps, samples):
    """The tensor cores' output layer in blocks of 32 samples or of 16 (a warp then loads two rows
    of z1^T at once): a = sigmoid(z1 + b1) written over z1^T, softmax(z2) - onehot(y) (zeros past
    n) and the summed cross-entropy of every sample against NumPy's from the same z1, with a last
    block part-filled (n = 203) and H = 300 rows."""
    import cupy

    from trainer.gpu.fused_step import FusedStep

    n, layout = 203, model.Layout(D=784, H=300)
    ds = data.load(None, n, None, "float32")
    params = cupy.asarray(model.init_params(layout, 2, "float32"))
    gbuf = cupy.zeros(layout.size + 1, dtype=np.float32)
    shaped = type("Shaped", (FusedStep,), {"OUT_WARPS": warps, "OUT_SAMPLES": samples})
    step = shaped(layout, params, gbuf, n, StepOptions(kind="fused", gemm="tf32"))
    step.e.fill(1)
    step.z1_gemm(cupy.asarray(ds.x_train))
    z1t = step.z[:, :n].get()  # H x n, z1^T as the GEMM wrote it
    step.output_layer(cupy.asarray(ds.y_train))
    p = layout.views(params.get().astype(np.float64))
    a = 1 / (1 + np.exp(-(z1t + p.b1[:, None])))
    np.testing.assert_allclose(step.z[:, :n].get(), a, rtol=1e-6)  # a^T over z1^T, for the hidden gradient
    z2 = p.W2 @ a + p.b2[:, None]
    yhat = np.exp(z2 - z2.max(axis=0))
    yhat /= yhat.sum(axis=0)
    onehot = np.eye(layout.C)[:, ds.y_train]
    np.testing.assert_allclose(step.e[:, :n].get(), yhat - onehot, atol=1e-6)
    assert not step.e[:, n:].any()
    ce = -np.log(yhat[ds.y_train, np.arange(n)]).sum()
    assert abs(float(gbuf[-1].get()) - ce) < 1e-5 * ce


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("gemm", "x_levels", "blocks"),
    [("tf32", None, 1), ("tf32x3", None, 3), ("tf32x3", data.PIXEL_LEVELS, 2), ("bf16x3", data.PIXEL_LEVELS, 3)],
)
def test_prepared_batches_hold_what_prepare_x_writes(gemm, x_levels, blocks):
    """FusedStep.prepare makes every batch's GEMM operands at once (batches in order); each must
    be what prepare_x writes for that batch in its step: a short last batch, a rank's empty share.
    With x_levels the parts are the pixels' bytes, k = 255 x."""
    import cupy

    ds = data.load(None, 300, None, "float32")
    layout = model.Layout(D=784, H=64)
    params = cupy.asarray(model.init_params(layout, 0, "float32"))
    gbuf = cupy.zeros(layout.size + 1, dtype=np.float32)
    x = cupy.asarray(ds.x_train)
    rows = [(0, 128), (128, 256), (256, 300), (300, 300)]
    step = make_step(StepOptions(kind="fused", gemm=gemm, x_levels=x_levels), cupy, layout, params, gbuf, 128)
    assert step.blocks == blocks
    prepared = step.prepare(x, rows)
    assert [len(p) for p in prepared] == [128, 128, 44, 0]
    for (lo, hi), p in zip(rows[:3], prepared):
        n, k = hi - lo, blocks * step.padded(hi - lo)
        step.prepare_x(x[lo:hi])
        np.testing.assert_array_equal(p.xt[:, :k].get(), step.xt[:, :k].get())
        if blocks > 1:
            np.testing.assert_array_equal(p.xcat.get(), step.xcat[:n].get())
        if x_levels:  # the pixels' bytes k, as TF32 (float32) values or BF16 ones (a float32's top half)
            k32 = np.rint(ds.x_train[lo:hi] * data.PIXEL_LEVELS).astype(np.float32)
            pixels = (k32.view(np.uint32) >> 16).astype(np.uint16) if gemm == "bf16x3" else k32
            np.testing.assert_array_equal(p.xcat[:, :784].get(), pixels)
            np.testing.assert_array_equal(p.xt[:, step.padded(n) : step.padded(n) + n].get(), pixels.T)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "gemm", "shuffle", "tol"),
    [
        ("float64", "sgemm", True, 1e-12),
        ("float32", "tf32x3", True, 1e-5),
        ("float32", "tf32x3", False, 1e-5),
        ("float32", "bf16x3", False, 1e-5),
    ],
)
def test_overlapped_step_matches_serial_step(dtype, gemm, shuffle, tol):
    """On one GPU, NCCL with a world of one rank: the overlapped step (sums on a side stream, W1
    in halves, the end of each update left to the next forward) trains the same weights and
    losses as the fused step that all-reduces after its backward pass."""
    import cupy

    from trainer.gpu.nccl import NcclAllreduce
    from trainer.ranks import parallel

    world = parallel.join_world(1)
    ds = data.load(None, 701, None, dtype)
    layout = model.Layout(D=784, H=300)
    schedule = Schedule(batch_size=256, lr=0.2, reg=1e-3, epochs=2, shuffle=shuffle, seed=5)
    x, y = cupy.asarray(ds.x_train), cupy.asarray(ds.y_train)
    results = {}
    for overlap in (False, True):
        losses = []
        params = cupy.asarray(model.init_params(layout, 1, dtype))
        options = StepOptions(kind="fused", gemm=gemm, overlap=overlap, x_levels=data.PIXEL_LEVELS)
        taken = step.build(options, cupy, layout, params, schedule.batch_size, 1, NcclAllreduce(world, dtype))
        fit(taken, cupy, params, x, y, schedule, on_epoch=lambda e, out=losses: out.append(e.losses))
        results[overlap] = (params.get(), np.concatenate(losses))
    (ps, ls), (po, lo) = results[False], results[True]
    assert np.linalg.norm(po - ps) / np.linalg.norm(ps) < tol
    np.testing.assert_allclose(lo, ls, rtol=tol)


@pytest.mark.gpu
def test_tf32x3_keeps_float32_accuracy():
    """One batch's loss gradient against float64: three TF32 products stay within a few times
    SGEMM's error (4.4-5.3x on an H100; the weights trained on full MNIST are as close to the
    CPU's as SGEMM's: docs/benchmarks.md), and so do two with X as its pixels' integer levels (exact in
    TF32); plain TF32 is orders of magnitude off."""
    import cupy

    ds = data.load(None, 1000, None, "float64")
    layout = model.Layout(D=784, H=512)
    init = model.init_params(layout, 0, "float64")
    truth = model.gradient(layout.views(init), layout, ds.x_train, ds.y_train, reg=0.0)
    x32, y = cupy.asarray(ds.x_train.astype(np.float32)), cupy.asarray(ds.y_train)
    errors = {}
    for name, gemm, x_levels in (
        ("sgemm", "sgemm", None),
        ("tf32x3", "tf32x3", None),
        ("tf32x2", "tf32x3", data.PIXEL_LEVELS),
        ("bf16x3", "bf16x3", data.PIXEL_LEVELS),
        ("tf32", "tf32", None),
    ):
        params = cupy.asarray(init.astype(np.float32))
        gbuf = cupy.zeros(layout.size + 1, dtype=np.float32)
        step = make_step(StepOptions(kind="fused", gemm=gemm, x_levels=x_levels), cupy, layout, params, gbuf, len(y))
        assert step.blocks == {"tf32x3": 3, "tf32x2": 2, "bf16x3": 3}.get(name, 1)
        step.forward(x32, y)
        step.backward(x32, y, 1 / len(y))
        errors[name] = np.linalg.norm(gbuf[:-1].get() - truth) / np.linalg.norm(truth)
    print(errors)
    assert errors["sgemm"] < 1e-5, errors
    assert errors["tf32x3"] < 8 * errors["sgemm"], errors
    assert errors["tf32x2"] < 8 * errors["sgemm"], errors
    assert errors["bf16x3"] < 8 * errors["sgemm"], errors
    assert errors["tf32"] > 30 * errors["tf32x3"], errors


@pytest.mark.gpu
def test_bf16x3_without_pixels_is_refused():
    """Three BF16 products keep float32 accuracy only with X exact in BF16 (bytes): inputs that
    promise nothing are refused, with the mode that takes them."""
    import cupy

    layout = model.Layout(D=784, H=32)
    params = cupy.asarray(model.init_params(layout, 0, "float32"))
    gbuf = cupy.zeros(layout.size + 1, dtype=np.float32)
    with pytest.raises(ValueError, match=r"gemm=bf16x3 needs inputs k / x_levels .* \(got None\); use tf32x3"):
        make_step(StepOptions(kind="fused", gemm="bf16x3"), cupy, layout, params, gbuf, 64)


@pytest.mark.gpu
def test_tf32_run_stays_close_to_float32(idx_dir, mlflow_uri, tmp_path):
    result = trainer([*COMMON[1:], "device=gpu", "gpu.gemm=tf32", f"data.dir={idx_dir}"], tmp_path)
    assert result.returncode == 0, result.stderr
    _, run = only_run(mlflow_uri)
    assert run.data.tags["sweepscale.gemm"] == "tf32" and run.data.tags["sweepscale.gemm_products"] == "1"
    assert run.data.metrics[metrics.weight_error("max")] < 1e-2  # TF32 GEMMs: ~1e-3 relative per product


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize(
    ("overlap", "extra", "tol", "overlapped", "window", "products"),
    [
        ("never", [], 1e-12, False, "symmetric", 1),  # float64: NCCL's regular kernels on the window's buffer
        ("always", [], 1e-12, True, "off", 1),  # DGEMM, like SGEMM: sums beside the GEMMs, no window (auto)
        ("always", ["hidden=1"], 1e-12, True, "off", 1),  # W1's second half has no rows: only b1, W2, b2, loss
        ("always", ["dtype=float32", "gpu.gemm=tf32x3", "hidden=300"], 1e-5, True, "symmetric", 2),
        # gpu.overlap=auto: on where it was measured to pay, not with tensor cores (default bf16x3). At H=2048 in
        # float32 lr=0.3 amplifies rounding to 1e-3 in two epochs (with or without overlap): lr=0.01.
        ("auto", ["dtype=float32", "gpu.gemm=sgemm", "hidden=2048", "lr=0.01"], 1e-5, True, "off", 1),
        ("auto", ["dtype=float32", "hidden=2048", "lr=0.01"], 1e-5, False, "symmetric", 3),  # bf16x3: 3 BF16 products
        ("never", ["dtype=float32", "gpu.gemm=tf32", "gpu.nccl_window=never"], 1e-2, False, "off", 1),
        ("always", ["dtype=float32", "hidden=300"], 1e-5, True, "symmetric", 3),  # bf16x3 overlapped
    ],
)
def test_nccl_allreduce_matches_reference(
    overlap, extra, tol, overlapped, window, products, idx_dir, mlflow_uri, tmp_path
):
    """2 ranks with NCCL against the sequential CPU reference, with the all-reduce after the
    backward pass and overlapped with the compute, in NCCL's symmetric window or not. 57 samples
    in batches of 7 end with a batch of 1: a rank without rows must still join both halves' sums."""
    if gpu_count() < 2:
        pytest.skip("NCCL needs a GPU per rank: this machine has fewer than 2 GPUs")
    args = [*COMMON, "device=gpu", "nproc=2", "gpu.comm=nccl", f"gpu.overlap={overlap}", f"data.dir={idx_dir}", *extra]
    result = trainer(args, tmp_path)
    assert result.returncode == 0, result.stderr
    _, run = only_run(mlflow_uri)
    assert run.data.tags["sweepscale.comm"] == "NcclAllreduce"
    assert run.data.tags["sweepscale.overlap"] == str(overlapped).lower()
    assert run.data.tags["sweepscale.nccl_window"] == window
    assert run.data.tags["sweepscale.gemm_products"] == str(products)
    assert run.data.metrics[metrics.weight_error("max")] < tol
    assert (metrics.ALLREDUCE_GBPS in run.data.metrics) != overlapped  # overlapped, the phase is a wait


@pytest.mark.gpu
@pytest.mark.mpi
def test_captured_step_matches_the_eager_step_after_20_steps_on_2_ranks(mlflow_uri, tmp_path):
    """gpu.graph=auto replays the fused step's phases as CUDA graphs from the second epoch on (4 batches
    an epoch, 5 epochs: 20 steps, 16 of them replayed): its weights are the eager step's (gpu.graph=never)
    within the float32 check's tolerance, and both pass the CPU check after all 20 steps."""
    if gpu_count() < 2:
        pytest.skip("NCCL needs a GPU per rank: this machine has fewer than 2 GPUs")
    common = ["device=gpu", "nproc=2", "hidden=256", "data.n_train=800", "batch_size=200", "epochs=5"]
    common += ["save.weights=true", "check.steps=all", "data.scale=unit", "model.init=fan_in"]  # as COMMON: tame
    runs = {}
    for graph in ("auto", "never"):
        result = trainer([*common, f"gpu.graph={graph}", f"mlflow.experiment=g{graph}"], tmp_path)
        assert result.returncode == 0, result.stderr
        runs[graph] = only_run(mlflow_uri, f"g{graph}")
    (client, graphed), (_, eager) = runs["auto"], runs["never"]
    assert graphed.data.tags["sweepscale.graph"] == "true" and eager.data.tags["sweepscale.graph"] == "false"
    assert int(graphed.data.tags[metrics.TAG_GRAPHS]) == 4 + 4 + 1 + 4  # forward, backward, update a batch; one sum
    w_graph, w_eager = final_weights(client, graphed), final_weights(client, eager)
    assert np.linalg.norm(w_graph - w_eager) / np.linalg.norm(w_eager) < 1e-5
    for run in (graphed, eager):
        assert run.data.metrics[metrics.weight_error("max")] < 1e-4


@pytest.mark.gpu
@pytest.mark.mpi
def test_the_phases_sum_and_skew_add_up_to_the_measured_batch(mlflow_uri, tmp_path):
    """On 2 GPUs the all-reduce phase splits into the sum itself and rank 0's wait for the slowest
    rank: the phases with them add up to the batch's time (medians of steady batches, within 15%)."""
    if gpu_count() < 2:
        pytest.skip("NCCL needs a GPU per rank: this machine has fewer than 2 GPUs")
    args = ["device=gpu", "nproc=2", "hidden=1024", "data.n_train=2000", "batch_size=400", "epochs=40"]
    result = trainer([*args, "check.reference=false"], tmp_path)
    assert result.returncode == 0, result.stderr
    _, run = only_run(mlflow_uri)
    m = run.data.metrics
    parts = ("h2d", "forward", "backward", "sum", "wait", "update")
    added, batch = sum(m[metrics.phase_time(p)] for p in parts), m[metrics.phase_time("batch")]
    assert abs(added - batch) <= 0.15 * batch, {p: m[metrics.phase_time(p)] for p in (*parts, "batch")}
    assert m[metrics.phase_time("skew")] >= m[metrics.phase_time("wait")] - 1e-9
    assert m[metrics.phase_time("queue")] > 0  # the CPU's time to queue a batch
    assert m[metrics.TIMED_BATCHES] >= 3 * 10


@pytest.mark.gpu
@pytest.mark.mpi
def test_sums_through_the_host_run_their_step_eagerly(mlflow_uri, tmp_path):
    """gpu.comm=mpi stages each sum through host memory with MPI: no CUDA graph can replay that, so
    the step runs eagerly (on one GPU the two ranks share it) and still matches the CPU."""
    args = ["device=gpu", "nproc=2", "gpu.comm=mpi", "hidden=64", "data.n_train=400", "batch_size=100", "epochs=3"]
    result = trainer([*args, "data.scale=unit", "model.init=fan_in", "check.steps=all"], tmp_path)
    assert result.returncode == 0, result.stderr
    _, run = only_run(mlflow_uri)
    assert run.data.tags["sweepscale.comm"] == "HostAllreduce" and run.data.tags["sweepscale.graph"] == "false"
    assert metrics.TAG_GRAPHS not in run.data.tags
    assert run.data.metrics[metrics.weight_error("max")] < 1e-4
