"""One training run: validate, start the ranks, train, check against the reference, record.

run -> data (trainer/data.py) -> model (model.py, the step: step.py) -> loop (loop.py) -> record (record.py)
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import traceback
from dataclasses import replace
from typing import Any

import numpy as np
from omegaconf import DictConfig

from trainer import console, metrics, model, parallel, tracking
from trainer import data as data_mod
from trainer.backend import Backend, gpu_count, select
from trainer.clock import PhaseClock
from trainer.config import Gemm, validate
from trainer.errors import ConfigError
from trainer.loop import STEP_PHASES, EpochResult, Schedule, fit
from trainer.options import StepOptions
from trainer.record import check_against_reference, record_performance, start_recording


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
        if cfg.gpu.gemm == Gemm.tf32:  # CuPy reads it at its first matmul; the ranks inherit it
            os.environ["CUPY_TF32"] = "1"
        if cfg.device.value == "cpu" or gpu_count() == 0:
            for key, gpu_only in (("step", "fused"), ("comm", "nccl")):
                if cfg.gpu[key].value == gpu_only:
                    raise ConfigError(f"gpu.{key}={gpu_only} needs a GPU and none is used here; set gpu.{key}=auto")
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


def train_and_record(cfg: DictConfig, world: parallel.World, ds: data_mod.Dataset) -> int:
    """Run on every rank. Rank 0 records; any failure ends the run and aborts the world."""
    uri = tracking.tracking_uri(cfg.mlflow.tracking_uri)
    recorder: tracking.Recorder | None = None
    run_id: str | None = None
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        backend = select(cfg.device, world.local_rank)
        options = StepOptions.resolve(cfg, backend.kind)  # the step's options, resolved once
        hosts = world.comm.gather(socket.gethostname())
        if world.rank == 0:
            recorder = start_recording(cfg, uri, world, backend, hosts)
            run_id = recorder.run_id
        run_id = world.comm.bcast(run_id)
        train_on_rank(cfg, options, world, backend, ds, recorder)
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


def train_on_rank(
    cfg: DictConfig,
    options: StepOptions,
    world: parallel.World,
    backend: Backend,
    ds: data_mod.Dataset,
    recorder: tracking.Recorder | None,
) -> None:
    xp, on_gpu = backend.xp, backend.kind == "gpu"
    layout = model.Layout(D=ds.n_features, H=cfg.hidden, C=data_mod.N_CLASSES)
    schedule = schedule_of(cfg)
    init = model.init_params(layout, cfg.seed, cfg.dtype.value, cfg.model.init.value)
    params = xp.array(init)  # a copy: init is kept for the reference and the artifact
    if cfg.data.on_device or not on_gpu:
        x_train, y_train = xp.asarray(ds.x_train), xp.asarray(ds.y_train)
    else:  # the course's way: each batch is copied from pinned host memory
        x_train, y_train = _pinned(ds.x_train), _pinned(ds.y_train)
    x_test, y_test = xp.asarray(ds.x_test), xp.asarray(ds.y_test)
    clock = PhaseClock(STEP_PHASES, gpu=on_gpu, nvtx=options.profile)
    n, dtype = layout.size + 1, params.dtype
    allreduce = parallel.make_allreduce(
        options.comm, world, on_gpu, backend.n_devices, xp, n, dtype, options.beside_gemm, options.nccl_window
    )
    overlap = options.overlap and allreduce.via == "nccl"  # NCCL alone can overlap
    if recorder is not None:
        recorder.set_tags(options.tags(type(allreduce).__name__, overlap))

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
    rank, size = world.rank, world.size
    fit(xp, layout, params, x_train, y_train, schedule, rank, size, allreduce, clock, on_epoch, fault, options)
    # perf.repeats: the first epoch timed again on scratch weights, on every rank (the sums are collective).
    repeat_ms = [clock.medians()["batch"]]  # r = 0: the training run's own median
    first_epoch = replace(schedule, epochs=1)
    for _ in range(cfg.perf.repeats - 1):  # each on a scratch copy of the initial weights
        repeat_clock = PhaseClock(STEP_PHASES, gpu=on_gpu)
        keywords = {"rank": rank, "size": size, "allreduce": allreduce, "clock": repeat_clock, "options": options}
        fit(xp, layout, xp.array(init), x_train, y_train, first_epoch, **keywords)
        repeat_ms.append(repeat_clock.medians()["batch"])
    if recorder is None:
        return
    if allreduce.via == "nccl":  # the window's state is known once fit has asked it for the gradient's buffer
        recorder.set_tags({"sweepscale.nccl_window": allreduce.window_state})
    final = backend.to_host(params)
    phase_ms = clock.medians()
    quartiles = {which: clock.quantiles(q) for which, q in metrics.QUANTILES.items()}
    n_train = len(ds.y_train)
    args = (recorder, cfg, layout, backend, phase_ms, world.size, overlap)
    record_performance(
        *args, options=options, comm=allreduce.via, n_train=n_train, quartiles=quartiles, repeat_ms=repeat_ms
    )
    rows = {
        "final loss": f"{last['loss']:.5f}",
        "test precision": "-" if last["precision"] is None else f"{last['precision']:.4f}",
        "ms per batch (median)": f"{phase_ms['batch']:.3f}",
        "ranks x device": f"{world.size} x {backend.kind} ({backend.device_name})",
    }
    if cfg.check.reference:
        rows["max weight error vs CPU"] = check_against_reference(recorder, cfg, layout, schedule, init, final, ds)
    if cfg.save.weights:
        recorder.log_npz("weights_initial.npz", dict(zip(model.NAMES, layout.views(init))))
        recorder.log_npz("weights_final.npz", dict(zip(model.NAMES, layout.views(final))))
    recorder.finish("FINISHED")
    console.summary(recorder.run_id, recorder.uri, rows)


def _pinned(a: np.ndarray) -> Any:
    import cupyx

    out = cupyx.empty_pinned(a.shape, dtype=a.dtype)
    out[...] = a
    return out
