"""What a run records in MLflow beside its losses: the config, the tags and the performance metrics
(phase times, the FLOP model's rates, bytes moved, utilization). The CPU check: trainer/lifecycle/check.py."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from trainer import metrics
from trainer.core import flops, model
from trainer.core.loop import EpochResult
from trainer.core.timing import Measured
from trainer.options import StepOptions
from trainer.ranks import parallel
from trainer.ranks.backend import Backend
from trainer.ranks.contention import TimedSpan
from trainer.record import checkpoint, console, store, tracking
from trainer.record.checkpoint import Checkpoint
from trainer.record.identity import config_hash

GENERIC = StepOptions()  # the generic step's options: a run's default


def flat_params(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config flattened to MLflow params: hidden, lr, ..., data.dir, gpu.gemm, ... The
    mlflow.* settings (where and how the run is recorded) are not params: MLflow shows them itself;
    nor is paths.* (where data lives here: data.dir holds the folder a run read)."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict) and v:
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v

    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    walk({k: v for k, v in resolved.items() if k not in ("mlflow", "paths")}, "")
    return out


def start_recording(
    cfg: DictConfig,
    uri: str,
    world: parallel.World,
    backend: Backend,
    hosts: list[str],
    background: bool = False,
    handoff: str | None = None,
) -> tracking.Recorder:
    """The run, with its tags, params and config.yaml; with ``background``, created in a thread
    (tracking.Recorder) while training starts, or with ``handoff`` journaled there if the store is
    still opening when the run needs it. The config is resolved here either way: an error in it
    stops the run before it trains."""
    own = {
        metrics.TAG_CONFIG_HASH: config_hash(cfg),
        "sweepscale.mpi_library": world.library,
        "sweepscale.world_size": str(world.size),
        "sweepscale.device": backend.kind,
        "sweepscale.device_name": backend.device_name,
        "sweepscale.hosts": ",".join(sorted(set(hosts))),
        metrics.TAG_TIMING: "cuda-events" if backend.kind == "gpu" else "perf-counter",
        metrics.TAG_WARM: "false",  # a warm worker's tags (in cfg.mlflow.tags) say otherwise
        **{f"sweepscale.version.{k}": v for k, v in backend.versions.items()},
    }
    if backend.kind == "cpu":
        own[metrics.TAG_BLAS_THREADS] = str(backend.blas_threads)
    configured = configured_tags(cfg)

    def tags() -> dict[str, str]:
        from trainer.record import (
            provenance,  # git and importlib.metadata: with the run's creation, off the first batch's way
        )

        return {**own, **provenance.code_tags(), **provenance.job_tags(), **configured}

    params, text = flat_params(cfg), OmegaConf.to_yaml(cfg, resolve=True)

    def setup(recorder: tracking.Recorder) -> None:
        recorder.log_params(params)
        recorder.log_text(text, "config.yaml")

    experiment = store.experiment_name(cfg.mlflow.experiment)
    name, spool = cfg.mlflow.run_name, cfg.mlflow.spool_dir
    return tracking.Recorder(uri, experiment, name, tags, setup, background, spool=spool, handoff=handoff)


def configured_tags(cfg: DictConfig) -> dict[str, str]:
    """The run's tags that its config sets: the sweep's (its id, warm worker) and its parent run."""
    configured = dict(cfg.mlflow.tags)
    if cfg.mlflow.parent_run_id:
        configured[metrics.TAG_PARENT] = cfg.mlflow.parent_run_id
    return configured


def resume_recording(uri: str, ckpt: Checkpoint, hosts: list[str], cfg: DictConfig) -> tracking.Recorder:
    """The checkpoint's run, RUNNING again (a requeued or restarted job goes on where it stopped, or
    a later sweep resumes it: the run joins that sweep); the checkpoint's own epoch is logged again
    in case the store never got it (the recorder drops what it holds)."""
    from trainer.record import provenance

    tags = {
        **configured_tags(cfg),
        metrics.TAG_RESUMED_FROM_EPOCH: str(ckpt.epoch),
        metrics.TAG_RESTARTS: os.environ.get("SLURM_RESTART_COUNT", "0"),
        "sweepscale.hosts": ",".join(sorted(set(hosts))),
        **provenance.job_tags(),
    }
    recorder = tracking.Recorder(uri, "", None, tags, resume=ckpt.run_id, spool=cfg.mlflow.spool_dir)
    precision = None if np.isnan(ckpt.precision) else ckpt.precision
    first = ckpt.iteration - len(ckpt.losses)
    record_epoch(recorder, EpochResult(ckpt.epoch, first, ckpt.losses, ckpt.batch_sizes, ckpt.seconds), precision)
    console.resumed(ckpt.run_id, ckpt.epoch, cfg.epochs)
    return recorder


def record_epoch(recorder: tracking.Recorder, e: EpochResult, precision: float | None) -> None:
    """An epoch's curves, sent at once: its mini-batch losses (step: global iteration), its mean
    loss, time and test precision (step: epoch)."""
    for i, value in enumerate(e.losses):
        recorder.metric(metrics.TRAIN_LOSS, value, e.first_iteration + i)
    recorder.metric(metrics.TRAIN_LOSS_EPOCH, e.mean_loss, e.epoch)
    recorder.metric(metrics.EPOCH_TIME, e.seconds, e.epoch)
    if precision is not None:
        recorder.metric(metrics.TEST_PRECISION, precision, e.epoch)
    recorder.flush()


def record_performance(
    recorder: tracking.Recorder,
    cfg: DictConfig,
    layout: model.Layout,
    backend: Backend,
    phase_ms: dict[str, float],
    nproc: int,
    overlap: bool = False,
    *,
    options: StepOptions = GENERIC,
    comm: str = "host",
    n_train: int | None = None,
    measured: Measured | None = None,
) -> None:
    """Phase times (median), the FLOP model's rates for a full batch of the global size (``n_train``
    caps it), the course's bytes and arithmetic intensity per rank and batch, and what the timing
    protocol measured (``measured``: quartiles, each repeat's median and their interval, the sum's
    split, the batches timed; trainer/core/timing.py).

    perf/utilization divides by the peak of the arithmetic the GEMMs ran on (``options``: the GEMM
    mode and the products per model GEMM; perf.peak_tflops overrides it);
    a utilization above 1 means that peak is wrong and is not logged: the tag
    sweepscale.utilization_error says why. ``comm``: trainer/core/flops.py COMMS. With ``overlap`` the
    allreduce phase is only a wait, so no all-reduce bandwidth is derived."""
    B, D, H, C = cfg.batch_size, layout.D, layout.H, layout.C
    if n_train is not None:
        B = min(B, n_train)  # a single, short batch is what was timed
        recorder.metric(metrics.N_TRAIN, n_train)
    itemsize = np.dtype(cfg.dtype.value).itemsize
    batch_flops, ar_bytes = flops.batch_flops(B, D, H, C), flops.allreduce_bytes(D, H, C, itemsize)
    recorder.metric(metrics.FLOPS_PER_BATCH, batch_flops)
    recorder.metric(metrics.ALLREDUCE_BYTES, ar_bytes)
    images_per_batch = backend.kind == "gpu" and not cfg.data.on_device
    _record_traffic(recorder, layout, -(-B // nproc), itemsize, nproc, comm, images_per_batch)  # rank 0's rows
    for phase, ms in phase_ms.items():
        recorder.metric(metrics.phase_time(phase), ms)
    if measured is not None:
        _record_protocol(recorder, measured)
    batch_s = phase_ms["batch"] / 1e3
    recorder.metric(metrics.SAMPLES_PER_S, B / batch_s)
    recorder.metric(metrics.TFLOPS, batch_flops / batch_s / 1e12)
    _record_utilization(recorder, cfg, backend, options, batch_flops / batch_s / 1e12, nproc)
    if nproc > 1 and not overlap and phase_ms.get("allreduce", 0) > 0:
        recorder.metric(metrics.ALLREDUCE_GBPS, ar_bytes / (phase_ms["allreduce"] / 1e3) / 1e9)


def record_resources(recorder: tracking.Recorder, kind: str, ranks: int, held_s: float, training_s: float) -> None:
    """GPU-seconds (core-seconds on CPU ranks): ``ranks`` x the seconds the run held its devices,
    and x the seconds its epochs took."""
    recorder.metric(metrics.device_seconds(kind), ranks * held_s)
    recorder.metric(metrics.device_seconds(kind, training=True), ranks * training_s)


def _record_traffic(
    recorder: tracking.Recorder,
    layout: model.Layout,
    rows: int,
    itemsize: int,
    nproc: int,
    comm: str,
    images_per_batch: bool,
) -> None:
    """The course's bytes moved per rank and batch (PCIe, MPI) and the arithmetic intensity."""
    D, H, C = layout.D, layout.H, layout.C
    moved = flops.transfer_bytes(rows, D, H, C, itemsize, nproc, comm, images_per_batch)
    recorder.metric(metrics.BYTES_PCI, moved["pci"])
    recorder.metric(metrics.BYTES_MPI, moved["mpi"])
    if moved["pci"] + moved["mpi"]:  # else unbounded, and MLflow would store inf as the largest float
        intensity = flops.arithmetic_intensity(flops.batch_flops(rows, D, H, C), moved["pci"] + moved["mpi"])
        recorder.metric(metrics.ARITHMETIC_INTENSITY, intensity)


def _record_protocol(recorder: tracking.Recorder, measured: Measured) -> None:
    for which, values in measured.quartiles.items():
        for phase, ms in values.items():
            recorder.metric(metrics.phase_quantile(phase, which), ms)
    for r, ms in enumerate(measured.repeats):
        recorder.metric(metrics.BATCH_MS_REPEAT, ms, r)
    lo, hi = measured.interval
    recorder.metric(metrics.BATCH_MS_LO, lo)
    recorder.metric(metrics.BATCH_MS_HI, hi)
    for part, ms in measured.split.items():
        recorder.metric(metrics.phase_time(part), ms)
    recorder.metric(metrics.TIMED_BATCHES, measured.batches)
    recorder.metric(metrics.EXTRA_STEPS, measured.extra)


def _record_utilization(
    recorder: tracking.Recorder, cfg: DictConfig, backend: Backend, options: StepOptions, tflops: float, nproc: int
) -> None:
    """perf/utilization against the peak of the arithmetic the GEMMs ran on; above 1 the peak is
    wrong, and a tag says so instead."""
    gemm, products = options.arithmetic, options.products
    arithmetic = flops.peak_arithmetic(gemm, products)
    peak = None
    if cfg.perf.peak_tflops:
        peak, arithmetic = cfg.perf.peak_tflops, f"perf.peak_tflops (the GEMMs: {arithmetic})"
    elif backend.kind == "gpu":
        peak = flops.peak_tflops(backend.device_name, gemm, products)
    if not peak:
        return
    recorder.set_tags({metrics.TAG_PEAK_TFLOPS: str(peak), metrics.TAG_PEAK_ARITHMETIC: arithmetic})
    utilization = tflops / (peak * nproc)
    if utilization <= 1:
        recorder.metric(metrics.UTILIZATION, utilization)
        return
    recorder.set_tags(
        {
            metrics.TAG_UTILIZATION_ERROR: (
                f"not logged: {tflops:.4g} TFLOP/s on {nproc} x {backend.device_name} would be "
                f"{utilization:.3g} of the peak, {peak:.4g} TFLOP/s per device ({arithmetic}); a run "
                "cannot beat its peak, so that peak is wrong for this arithmetic: fix perf.peak_tflops "
                "or trainer/core/flops.py PEAKS"
            )
        }
    )


def record_beside(recorder: tracking.Recorder, span: TimedSpan, core_wait: float | None = None) -> None:
    """What else ran while the batches were timed: the report trusts timings with nothing beside.
    ``core_wait``: the largest share of them a rank waited for a core (None: not known here)."""
    recorder.metric(metrics.BESIDE, len(span.beside))
    recorder.metric(metrics.HOST_WAIT_S, span.waited_s)
    if core_wait is not None:
        recorder.metric(metrics.CORE_WAIT, core_wait)
    tags = {metrics.TAG_TIMING_POLICY: "exclusive" if span.exclusive else "shared"}
    if span.beside:
        tags[metrics.TAG_BESIDE] = ", ".join(span.beside)[:5000]
    if span.alongside:  # on other GPUs: not counted as company
        tags[metrics.TAG_ALONGSIDE] = ", ".join(span.alongside)[:5000]
    recorder.set_tags(tags)


def finish_run(
    cfg: DictConfig,
    recorder: tracking.Recorder,
    layout: model.Layout,
    init: np.ndarray,
    final: np.ndarray,
    last: dict[str, float | None],
    batch_ms: float,
    size: int,
    backend: Backend,
    job: Any,  # the check's reference job, None when there is none
) -> None:
    """Rank 0: the weights kept, the run FINISHED with its training (its check may land later), the
    checkpoint gone, the summary printed."""
    if cfg.save.weights:
        recorder.log_npz("weights_initial.npz", dict(zip(model.NAMES, layout.views(init))))
        recorder.log_npz("weights_final.npz", dict(zip(model.NAMES, layout.views(final))))
    if job is not None:
        recorder.set_tags({metrics.TAG_CHECK: "pending"})
    recorder.finish("FINISHED", close=job is None)
    checkpoint.remove(cfg.save.checkpoint_dir)  # nothing left to resume
    rows = {
        "final loss": f"{last['loss']:.5f}",
        "test precision": "-" if last["precision"] is None else f"{last['precision']:.4f}",
        "ms per batch (median)": f"{batch_ms:.3f}",
        "ranks x device": f"{size} x {backend.kind} ({backend.device_name})",
    }
    console.summary(recorder.run_id, recorder.uri, rows)
