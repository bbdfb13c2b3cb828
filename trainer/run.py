"""One training run: validate, start the ranks, train, check against the reference, record.

data -> model -> all-reduce -> update -> record
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import traceback
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from trainer import console, flops, metrics, model, parallel, provenance, reference, tracking
from trainer import data as data_mod
from trainer.backend import Backend, gpu_count, select
from trainer.clock import PhaseClock
from trainer.config import ConfigError, NcclWindow, Overlap, config_hash, validate
from trainer.loop import STEP_PHASES, EpochResult, Schedule, fit, time_first_epoch
from trainer.steps import gemm_products, sums_beside_gemm


class Terminated(BaseException):
    """SIGTERM reached a rank: end the run KILLED, like Ctrl-C."""


def _raise_terminated(_signum: int, _frame: Any) -> None:
    # Once: Slurm signals every process of the step, so a second SIGTERM (from the job's wrapper)
    # must not interrupt the recording of the first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated("terminated by SIGTERM")


def main(cfg: DictConfig, argv: list[str]) -> int:
    """Entry point: returns the process exit status. ``argv`` (the CLI's) re-creates cfg in each rank."""
    try:
        validate(cfg)
        if cfg.tf32:  # CuPy reads it at its first matmul; the ranks inherit it
            os.environ["CUPY_TF32"] = "1"
        if cfg.device.value == "cpu" or gpu_count() == 0:
            for key, gpu_only in (("step", "fused"), ("comm", "nccl")):
                if cfg[key].value == gpu_only:
                    raise ConfigError(f"{key}={gpu_only} needs a GPU and none is used here; set {key}=auto")
        ds = load_data(cfg)  # bad data is reported here, before any rank starts or trains
        if cfg.nproc > 1 and not parallel.launched_by_mpi():
            return parallel.run_under_mpiexec(parallel.find_mpiexec(cfg.mpi.mpiexec), cfg.nproc, argv)
        world = parallel.join_world(cfg.nproc)
    except ConfigError as e:
        if parallel.launcher_rank() == 0:  # every rank finds the same error: say it once
            print(f"Error: {e}", file=sys.stderr)
        return 2
    return train_and_record(cfg, world, ds)


def load_data(cfg: DictConfig) -> data_mod.Dataset:
    return data_mod.load(cfg.data.dir, cfg.data.n_train, cfg.data.n_test, cfg.dtype.value, cfg.data.scale.value)


def schedule_of(cfg: DictConfig) -> Schedule:
    return Schedule(cfg.batch_size, cfg.lr, cfg.reg, cfg.epochs, cfg.data.shuffle, cfg.seed)


def flat_params(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config flattened to MLflow params: hidden, lr, ..., data.dir, ... The mlflow.*
    settings (where and how the run is recorded) are not params: MLflow shows them itself."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict) and v:
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v

    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    walk({k: v for k, v in resolved.items() if k != "mlflow"}, "")
    return out


def train_and_record(cfg: DictConfig, world: parallel.World, ds: data_mod.Dataset) -> int:
    """Run on every rank. Rank 0 records; any failure ends the run and aborts the world."""
    uri = tracking.tracking_uri(cfg.mlflow.tracking_uri)
    recorder: tracking.Recorder | None = None
    run_id: str | None = None
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        backend = select(cfg.device, world.local_rank)
        hosts = world.comm.gather(socket.gethostname())
        if world.rank == 0:
            recorder = start_recording(cfg, uri, world, backend, hosts)
            run_id = recorder.run_id
        run_id = world.comm.bcast(run_id)
        train_on_rank(cfg, world, backend, ds, recorder)
        return 0
    except BaseException as e:
        status = "KILLED" if isinstance(e, (KeyboardInterrupt, Terminated)) else "FAILED"
        text = traceback.format_exc()
        print(f"[rank {world.rank}] run {status}:\n{text}", file=sys.stderr, flush=True)
        if run_id is not None:
            try:
                if recorder is not None:
                    recorder.flush()
                tracking.mark_ended(uri, run_id, status, text, world.rank)
            except Exception as record_error:  # the store may be what failed
                print(f"[rank {world.rank}] could not record the failure: {record_error}", file=sys.stderr)
        if world.size > 1:
            world.abort(1)  # the other ranks may wait in a collective: end them all now
        return 1


def start_recording(
    cfg: DictConfig, uri: str, world: parallel.World, backend: Backend, hosts: list[str]
) -> tracking.Recorder:
    tags = {
        metrics.TAG_CONFIG_HASH: config_hash(cfg),
        "sweepscale.mpi_library": world.library,
        "sweepscale.world_size": str(world.size),
        "sweepscale.device": backend.kind,
        "sweepscale.device_name": backend.device_name,
        "sweepscale.hosts": ",".join(sorted(set(hosts))),
        metrics.TAG_TIMING: "cuda-events" if backend.kind == "gpu" else "perf-counter",
        **{f"sweepscale.version.{k}": v for k, v in backend.versions.items()},
        **provenance.code_tags(),
        **dict(cfg.mlflow.tags),
    }
    if cfg.mlflow.parent_run_id:
        tags["mlflow.parentRunId"] = cfg.mlflow.parent_run_id
    recorder = tracking.Recorder(uri, tracking.experiment_name(cfg.mlflow.experiment), cfg.mlflow.run_name, tags)
    recorder.log_params(flat_params(cfg))
    recorder.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
    return recorder


def train_on_rank(
    cfg: DictConfig,
    world: parallel.World,
    backend: Backend,
    ds: data_mod.Dataset,
    recorder: tracking.Recorder | None,
) -> None:
    xp = backend.xp
    layout = model.Layout(D=ds.n_features, H=cfg.hidden, C=data_mod.N_CLASSES)
    schedule = schedule_of(cfg)
    init = model.init_params(layout, cfg.seed, cfg.dtype.value, cfg.model.init.value)
    params = xp.array(init)  # a copy: init is kept for the reference and the artifact
    if cfg.data.on_device or backend.kind == "cpu":
        x_train, y_train = xp.asarray(ds.x_train), xp.asarray(ds.y_train)
    else:  # the seeds' way: each batch is copied from pinned host memory
        x_train, y_train = _pinned(ds.x_train), _pinned(ds.y_train)
    x_test, y_test = xp.asarray(ds.x_test), xp.asarray(ds.y_test)
    clock = PhaseClock(STEP_PHASES, gpu=backend.kind == "gpu", nvtx=cfg.profile)
    step = step_name(cfg, backend)
    wanted = overlap_wanted(cfg, step)
    beside_gemm = wanted and sums_beside_gemm(gemm_mode(cfg))
    allreduce = parallel.make_allreduce(
        cfg.comm.value, world, backend.kind == "gpu", backend.n_devices, xp, layout.size + 1, params.dtype, beside_gemm,
        window_wanted(cfg.nccl_window.value, beside_gemm),
    )  # fmt: skip
    overlap = wanted and isinstance(allreduce, parallel.NcclAllreduce)  # NCCL alone can overlap
    if recorder is not None:
        recorder.set_tags({"sweepscale.comm": type(allreduce).__name__, "sweepscale.step": step})
        if step == "fused":
            products = gemm_products(gemm_mode(cfg), params.dtype, data_mod.pixel_levels(cfg.data.scale.value))
            recorder.set_tags(
                {
                    "sweepscale.gemm": gemm_mode(cfg),
                    "sweepscale.gemm_products": str(products),
                    "sweepscale.overlap": str(overlap).lower(),
                }
            )

    def on_epoch(e: EpochResult) -> None:
        if recorder is None:
            return
        for i, value in enumerate(e.losses):
            recorder.metric(metrics.TRAIN_LOSS, value, e.first_iteration + i)
        recorder.metric(metrics.TRAIN_LOSS_EPOCH, e.mean_loss, e.epoch)
        recorder.metric(metrics.EPOCH_TIME, e.seconds, e.epoch)
        precision = None
        if len(ds.y_test):
            precision = float(model.correct(layout.views(params), x_test, y_test)) / len(ds.y_test)
            recorder.metric(metrics.TEST_PRECISION, precision, e.epoch)
        recorder.flush()
        console.epoch_line(e.epoch, cfg.epochs, e.mean_loss, precision, e.seconds)
        last.update(loss=e.mean_loss, precision=precision)

    last: dict[str, float | None] = {}
    fault = cfg.fault.iteration if cfg.fault.rank == world.rank else None
    fit(
        xp, layout, params, x_train, y_train, schedule, world.rank, world.size, allreduce, clock, on_epoch, fault,
        step_kind=cfg.step.value, gemm=gemm_mode(cfg), overlap=overlap,
        x_levels=data_mod.pixel_levels(cfg.data.scale.value),
    )  # fmt: skip
    # perf.repeats: the first epoch timed again on scratch weights, on every rank (the sums are collective).
    repeat_ms = [clock.medians()["batch"]]  # r = 0: the training run's own median
    levels = data_mod.pixel_levels(cfg.data.scale.value)
    options = {"step_kind": cfg.step.value, "gemm": gemm_mode(cfg), "overlap": overlap, "x_levels": levels}
    for _ in range(cfg.perf.repeats - 1):
        repeat_clock = PhaseClock(STEP_PHASES, gpu=backend.kind == "gpu")
        args = (xp, layout, xp.array(init), x_train, y_train, schedule, repeat_clock, world.rank, world.size, allreduce)
        repeat_ms.append(time_first_epoch(*args, **options))
    if recorder is None:
        return
    if isinstance(allreduce, parallel.NcclAllreduce):  # known once fit has asked it for the gradient's buffer
        recorder.set_tags({"sweepscale.nccl_window": allreduce.window_state})
    final = backend.to_host(params)
    phase_ms = clock.medians()
    n_products = gemm_products(gemm_mode(cfg), params.dtype, levels) if step == "fused" else 1
    comm = "nccl" if isinstance(allreduce, parallel.NcclAllreduce) else "mpi" if backend.kind == "gpu" else "host"
    quartiles = {which: clock.quantiles(q) for which, q in metrics.QUANTILES.items()}
    record_performance(
        recorder, cfg, layout, backend, phase_ms, world.size, overlap, step=step, products=n_products, comm=comm,
        n_train=len(ds.y_train), quartiles=quartiles, repeat_ms=repeat_ms,
    )  # fmt: skip
    rows = {
        "final loss": f"{last['loss']:.5f}",
        "test precision": "-" if last["precision"] is None else f"{last['precision']:.4f}",
        "ms per batch (median)": f"{phase_ms['batch']:.3f}",
        "ranks x device": f"{world.size} x {backend.kind} ({backend.device_name})",
    }
    if cfg.check.reference:
        key = reference.cache_key(
            layout, schedule, cfg.dtype.value, cfg.seed, ds.fingerprint(),
            init=cfg.model.init.value, scale=cfg.data.scale.value,
        )  # fmt: skip
        ref, cached = reference.reference_params(
            layout, init, ds.x_train, ds.y_train, schedule, cfg.check.cache_dir, key
        )
        errors = reference.relative_errors(layout, final, ref)
        for name, err in errors.items():
            recorder.metric(metrics.weight_error(name), err)
        rows["max weight error vs CPU"] = f"{errors['max']:.3e}"
        recorder.set_tags({"sweepscale.reference": "cached" if cached else "computed", "sweepscale.reference_key": key})
    if cfg.save.weights:
        recorder.log_npz("weights_initial.npz", dict(zip(model.NAMES, layout.views(init))))
        recorder.log_npz("weights_final.npz", dict(zip(model.NAMES, layout.views(final))))
    recorder.finish("FINISHED")
    console.summary(recorder.run_id, recorder.uri, rows)


def step_name(cfg: DictConfig, backend: Backend) -> str:
    if cfg.step.value != "auto":
        return cfg.step.value
    return "fused" if backend.kind == "gpu" else "generic"


def gemm_mode(cfg: DictConfig) -> str:
    """How the fused step's GEMMs run: tf32 when asked, else fp32_gemm (float32 only)."""
    if cfg.dtype.value != "float32":
        return "dgemm"  # float64: whatever fp32_gemm says
    return "tf32" if cfg.tf32 else cfg.fp32_gemm.value


# Where the overlapped step was measured faster than summing after the backward pass (4 H200s,
# weak scaling, 4 GPUs, BENCHMARKS.md "Which sizes the overlap pays at"): SGEMM at H=2048 (0.615
# against 0.637 ms with 3200 rows per GPU, 0.361 against 0.375 with 1600). It lost everywhere
# else measured, by 2 to 24%: SGEMM at H=512, 1024 and 4096; 3xTF32 at H=512, 1024 and 4096 and
# at H=2048 with 1600 rows per GPU (with 3200 it gained 3%); TF32 at H=2048. Unmeasured widths
# are not overlapped. Against the sums in NCCL's window (nccl_window), measured later at H=2048:
# SGEMM still gains (0.616 against 0.630 ms), 3xTF32 ties (0.347, 0.348), TF32 loses (0.217, 0.202).
OVERLAP_PAYS = frozenset({("sgemm", 2048)})  # (GEMM mode, hidden)


def overlap_wanted(cfg: DictConfig, step: str) -> bool:
    """Whether the fused step should sum W1's gradient in halves behind its compute (with NCCL):
    overlap=auto does where it was measured to pay (OVERLAP_PAYS)."""
    if step != "fused" or cfg.nproc == 1 or cfg.overlap == Overlap.never:
        return False
    return cfg.overlap == Overlap.always or (gemm_mode(cfg), cfg.hidden) in OVERLAP_PAYS


def window_wanted(nccl_window: str, beside_gemm: bool) -> bool:
    """Whether NCCL sums the gradient in a symmetric memory window (trainer/nccl.py). Its
    symmetric kernels sum the 6.5 MB gradient of H=2048 in 43 us instead of 49 at 4 H200s, 30
    instead of 41 at 2, and slow a GEMM beside them less; the steps that sum after the backward
    pass gain (TF32 at 4 GPUs: 0.202 against 0.212 ms). Beside SGEMMs (the overlapped SGEMM step)
    the step lost (0.634 against 0.614 ms at 2 GPUs), so nccl_window=auto leaves that case out
    (BENCHMARKS.md, "NCCL's symmetric window"). ``nccl_window``: auto, always or never."""
    return nccl_window == NcclWindow.always.value or (nccl_window == NcclWindow.auto.value and not beside_gemm)


def _pinned(a: np.ndarray) -> Any:
    import cupyx

    out = cupyx.empty_pinned(a.shape, dtype=a.dtype)
    out[...] = a
    return out


def record_performance(
    recorder: tracking.Recorder,
    cfg: DictConfig,
    layout: model.Layout,
    backend: Backend,
    phase_ms: dict[str, float],
    nproc: int,
    overlap: bool = False,
    *,
    step: str = "generic",
    products: int = 1,
    comm: str = "host",
    n_train: int | None = None,
    quartiles: dict[str, dict[str, float]] | None = None,
    repeat_ms: list[float] | None = None,
) -> None:
    """Phase times (median, and ``quartiles``: {"q1": ..., "q3": ...} of each phase), the FLOP
    model's rates for a full batch of the global size (``n_train`` caps it), the course's bytes and
    arithmetic intensity per rank and batch, and the median batch time of each timing repeat.

    perf/utilization divides by the peak of the arithmetic the GEMMs ran on (``step`` and the config
    give the GEMM mode, ``products`` the products per model GEMM; perf.peak_tflops overrides it);
    a utilization above 1 means that peak is wrong and is not logged: the tag
    sweepscale.utilization_error says why. ``comm``: trainer/flops.py COMMS. With ``overlap`` the
    allreduce phase is only a wait, so no all-reduce bandwidth is derived."""
    B, D, H, C = cfg.batch_size, layout.D, layout.H, layout.C
    if n_train is not None:
        B = min(B, n_train)  # a single, short batch is what was timed
    itemsize = np.dtype(cfg.dtype.value).itemsize
    batch_flops = flops.batch_flops(B, D, H, C)
    ar_bytes = flops.allreduce_bytes(D, H, C, itemsize)
    recorder.metric(metrics.FLOPS_PER_BATCH, batch_flops)
    recorder.metric(metrics.ALLREDUCE_BYTES, ar_bytes)
    rows = -(-B // nproc)  # rank 0's share of the batch, the largest
    images_per_batch = backend.kind == "gpu" and not cfg.data.on_device
    moved = flops.transfer_bytes(rows, D, H, C, itemsize, nproc, comm, images_per_batch)
    recorder.metric(metrics.BYTES_PCI, moved["pci"])
    recorder.metric(metrics.BYTES_MPI, moved["mpi"])
    if moved["pci"] + moved["mpi"]:  # else unbounded, and MLflow would store inf as the largest float
        recorder.metric(
            metrics.ARITHMETIC_INTENSITY,
            flops.arithmetic_intensity(flops.batch_flops(rows, D, H, C), moved["pci"] + moved["mpi"]),
        )
    for phase, ms in phase_ms.items():
        recorder.metric(metrics.phase_time(phase), ms)
    for which, values in (quartiles or {}).items():
        for phase, ms in values.items():
            recorder.metric(metrics.phase_quantile(phase, which), ms)
    for r, ms in enumerate(repeat_ms or []):
        recorder.metric(metrics.BATCH_MS_REPEAT, ms, r)
    batch_s = phase_ms["batch"] / 1e3
    tflops = batch_flops / batch_s / 1e12
    recorder.metric(metrics.SAMPLES_PER_S, B / batch_s)
    recorder.metric(metrics.TFLOPS, tflops)
    gemm = gemm_mode(cfg) if step == "fused" else ("tf32" if cfg.tf32 else cfg.dtype.value)
    arithmetic = flops.peak_arithmetic(gemm, products)
    peak = None
    if cfg.perf.peak_tflops:
        peak, arithmetic = cfg.perf.peak_tflops, f"perf.peak_tflops (the GEMMs: {arithmetic})"
    elif backend.kind == "gpu":
        peak = flops.peak_tflops(backend.device_name, gemm, products)
    if peak:
        recorder.set_tags({metrics.TAG_PEAK_TFLOPS: str(peak), metrics.TAG_PEAK_ARITHMETIC: arithmetic})
        utilization = tflops / (peak * nproc)
        if utilization <= 1:
            recorder.metric(metrics.UTILIZATION, utilization)
        else:
            recorder.set_tags(
                {
                    metrics.TAG_UTILIZATION_ERROR: (
                        f"not logged: {tflops:.4g} TFLOP/s on {nproc} x {backend.device_name} would be "
                        f"{utilization:.3g} of the peak, {peak:.4g} TFLOP/s per device ({arithmetic}); a run "
                        "cannot beat its peak, so that peak is wrong for this arithmetic: fix perf.peak_tflops "
                        "or trainer/flops.py PEAKS"
                    )
                }
            )
    if nproc > 1 and not overlap and phase_ms.get("allreduce", 0) > 0:
        recorder.metric(metrics.ALLREDUCE_GBPS, ar_bytes / (phase_ms["allreduce"] / 1e3) / 1e9)
