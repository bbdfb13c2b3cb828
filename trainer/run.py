"""One training run: validate, start the ranks, train, check against the reference, record.

run -> data (trainer/data.py) -> model (model.py, the step: step.py) -> loop (loop.py) -> record (record.py)
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import traceback
from dataclasses import replace

import numpy as np
from omegaconf import DictConfig

from trainer import data as data_mod
from trainer import limits, metrics, step
from trainer.config import Divergence, Timing, validate
from trainer.core import model, reference
from trainer.core.clock import PhaseClock, process_start
from trainer.core.loop import STEP_PHASES, EpochResult, Schedule, Snapshot, check_finite, fit
from trainer.errors import ConfigError
from trainer.gpu import policy
from trainer.lifecycle import launch, reference_jobs, requeue
from trainer.lifecycle.check import PendingCheck, first_weights, steps_checked
from trainer.lifecycle.check import start as start_reference
from trainer.lifecycle.requeue import TimeLimitReached
from trainer.options import StepOptions
from trainer.ranks import parallel, sigterm
from trainer.ranks.backend import Backend, gpu_count, pinned, select
from trainer.ranks.contention import for_run
from trainer.ranks.sigterm import Terminated
from trainer.record import checkpoint, console, store, tracking
from trainer.record.run_record import record_beside, record_epoch, record_performance, resume_recording, start_recording
from trainer.record.uri_check import check_uri


def main(cfg: DictConfig, argv: list[str]) -> int:
    """Entry point: returns the process exit status. ``argv`` (the CLI's) re-creates cfg in each rank."""
    try:
        validate(cfg)
        os.environ.update(policy.tf32_env(cfg.gpu.gemm.value))  # the ranks inherit it
        policy.check_gpu_keys(cfg, cfg.device.value != "cpu" and gpu_count() > 0)
        if not parallel.launched_by_mpi():  # the launching process: before any rank starts
            check_uri(store.tracking_uri(cfg.mlflow.tracking_uri))
            limits.check_folders(cfg)
            checkpoint.load(cfg.save.checkpoint_dir, checkpoint.resume_key(cfg))  # another config's: refused
        ds = load_data(cfg)  # bad data is reported here, before any rank starts or trains
        if cfg.nproc > 1 and not parallel.launched_by_mpi():
            return launch.launch_ranks(cfg, argv)
        world = parallel.join_world(cfg.nproc)
    except ConfigError as e:
        if parallel.launcher_rank() == 0:  # every rank finds the same error: say it once
            print(f"Error: {e}", file=sys.stderr)
        return 2
    try:
        return train_and_record(cfg, world, ds)
    finally:  # a run that failed may leave its reference computing: nothing waits for it now
        reference_jobs.shutdown()


def load_data(cfg: DictConfig) -> data_mod.Dataset:
    return data_mod.load(cfg.data.dir, cfg.data.n_train, cfg.data.n_test, cfg.dtype.value, cfg.data.scale.value)


def schedule_of(cfg: DictConfig) -> Schedule:
    return Schedule(cfg.batch_size, cfg.lr, cfg.reg, cfg.epochs, cfg.data.shuffle, cfg.seed)


KILLED_STATUS = 143  # 128 + SIGTERM: the run ended KILLED; a warm worker stops serving points


def train_and_record(
    cfg: DictConfig, world: parallel.World, ds: data_mod.Dataset, *, origin: float | None = None
) -> int:
    """Run on every rank; 0, 1 (FAILED) or KILLED_STATUS. Rank 0 then waits for the run's CPU check."""
    outcome = train_and_defer(cfg, world, ds, origin=origin)
    return outcome.finish() if isinstance(outcome, PendingCheck) else outcome


def train_and_defer(
    cfg: DictConfig, world: parallel.World, ds: data_mod.Dataset, *, origin: float | None = None
) -> int | PendingCheck:
    """Run on every rank: 1 (FAILED) or KILLED_STATUS if training failed, else 0 on ranks > 0 and on
    rank 0 the ended run's check still to land (:class:`PendingCheck`). Rank 0 records; a failure ends
    the run and, in a world of several ranks (the others may wait in a collective), aborts the world."""
    uri = store.tracking_uri(cfg.mlflow.tracking_uri)
    recorder: tracking.Recorder | None = None
    run_id: str | None = None
    sigterm.install()
    requeue.arm()
    try:
        backend = select(cfg.device, world.local_rank)
        options = policy.step_options(cfg, backend.kind)  # the step's options, resolved once
        hosts = world.comm.gather(socket.gethostname())
        devices = world.comm.gather(backend.describe())  # each rank's own GPU (or cpu), on its node
        key = checkpoint.resume_key(cfg)  # rank 0 reads, the others get it: one view of the folder
        ckpt = world.comm.bcast(checkpoint.load(cfg.save.checkpoint_dir, key) if world.rank == 0 else None)
        if world.rank == 0 and ckpt is not None:  # a requeued or restarted job: the same run goes on
            recorder = resume_recording(uri, ckpt, hosts, cfg)
            run_id = recorder.run_id
        elif world.rank == 0:
            # Alone, rank 0 creates the run while it trains; other ranks need its id before (to record a failure).
            background = world.size == 1 and store.opens_in_background(uri)
            recorder = start_recording(cfg, uri, world, backend, hosts, background)
            run_id = None if background else recorder.run_id
        if world.rank == 0:
            launch.tell_launcher(run_id)
            recorder.set_tags({metrics.TAG_RANK_DEVICES: rank_devices(hosts, devices)})
        parallel.wait_for_all(world.comm)  # rank 0 creates the run meanwhile
        run_id = world.comm.bcast(run_id)
        try:
            pending = train_on_rank(cfg, options, world, backend, ds, recorder, origin, ckpt)
        finally:  # a run created in the background: its id, once known, lets a failure be recorded
            if recorder is not None:
                run_id = recorder.settled_run_id()
        return 0 if pending is None else pending
    except BaseException as e:
        if isinstance(e, TimeLimitReached):  # every rank stopped at the same epoch: rank 0 says so
            if world.rank == 0:
                _record_failure(e, uri, run_id, recorder, 0, traced=False)
            return requeue.REQUEUE_STATUS if e.requeue else 1
        status = _record_failure(e, uri, run_id, recorder, world.rank)
        if world.size > 1:
            world.abort(1)  # the other ranks may wait in a collective: end them all now
        return status


def rank_devices(hosts: list[str], devices: list[str]) -> str:
    """Which node and device each rank trained on: ``0=node1/gpu0 (NVIDIA H100 ...); 1=node1/gpu1 (...)``."""
    return "; ".join(f"{r}={host}/{device}" for r, (host, device) in enumerate(zip(hosts, devices)))[:5000]


def _record_failure(
    e: BaseException, uri: str, run_id: str | None, recorder: tracking.Recorder | None, rank: int, traced: bool = True
) -> int:
    """End the run FAILED, or KILLED on Ctrl-C, SIGTERM or a time limit it will resume from, with
    the error; returns the status."""
    killed = isinstance(e, (KeyboardInterrupt, Terminated)) or sigterm.seen() or getattr(e, "requeue", False)
    status = "KILLED" if killed else "FAILED"
    text = traceback.format_exc() if traced else f"{type(e).__name__}: {e}"
    print(f"[rank {rank}] run {status}:\n{text}", file=sys.stderr, flush=True)
    if run_id is not None:
        try:
            if recorder is not None:  # its queued metrics first, and through its journal if it keeps one
                recorder.fail(status, text, rank)
            else:
                tracking.mark_ended(uri, run_id, status, text, rank)
        except Exception as record_error:  # the store may be what failed
            print(f"[rank {rank}] could not record the failure: {record_error}", file=sys.stderr)
    return KILLED_STATUS if status == "KILLED" else 1


def train_on_rank(
    cfg: DictConfig,
    options: StepOptions,
    world: parallel.World,
    backend: Backend,
    ds: data_mod.Dataset,
    recorder: tracking.Recorder | None,
    origin: float | None = None,
    ckpt: checkpoint.Checkpoint | None = None,
) -> PendingCheck | None:
    """``origin``: a time.time() value, the start of the time to first batch (None: this process's start).
    ``ckpt``: the checkpoint to resume from. Rank 0 ends its run FINISHED and returns its check, to
    land once the reference is there; other ranks None."""
    origin = process_start() if origin is None else origin
    xp, on_gpu = backend.xp, backend.kind == "gpu"
    layout, init = first_weights(cfg, ds.n_features)
    schedule = schedule_of(cfg)
    params = xp.array(init if ckpt is None else ckpt.params)  # a copy: init is kept for the reference and the artifact
    if cfg.data.on_device or not on_gpu:
        x_train, y_train = xp.asarray(ds.x_train), xp.asarray(ds.y_train)
    else:  # the course's way: each batch is copied from pinned host memory
        x_train, y_train = pinned(ds.x_train), pinned(ds.y_train)
    x_test, y_test = xp.asarray(ds.x_test), xp.asarray(ds.y_test)
    clock = PhaseClock(STEP_PHASES, gpu=on_gpu, nvtx=options.profile)
    n, dtype = layout.size + 1, params.dtype
    allreduce = parallel.make_allreduce(
        options.comm, world, on_gpu, backend.n_devices, xp, n, dtype, options.beside_gemm, options.nccl_window
    )
    overlap = options.overlap and allreduce.overlaps  # NCCL alone can
    job, steps = None, steps_checked(cfg, len(ds.y_train), schedule)  # the check compares the first `steps`
    snapshot = Snapshot(steps) if 0 < steps < reference.steps_of("all", len(ds.y_train), schedule) else None
    if snapshot is not None and ckpt is not None and ckpt.snapshot.size:  # taken before the job was requeued
        snapshot.weights = ckpt.snapshot

    def snapshot_on_host() -> np.ndarray:
        """The check's weights on the host: copied from the device once (they no longer change)."""
        if snapshot is None or snapshot.weights is None:
            return np.zeros(0)
        if not isinstance(snapshot.weights, np.ndarray):
            snapshot.weights = backend.to_host(snapshot.weights)
        return snapshot.weights

    if recorder is not None:
        recorder.set_tags(options.tags(type(allreduce).__name__, overlap))
        if steps:
            recorder.set_tags({metrics.TAG_CHECK_STEPS: str(steps)})
        if steps and on_gpu:  # beside the GPU's training, on CPU cores it leaves idle
            job = start_reference(cfg, layout, schedule, init, ds, steps)

    checkpoints = cfg.save.checkpoint_dir if recorder is not None else None
    key = checkpoint.resume_key(cfg) if checkpoints else ""  # once: hashing the config is not per epoch work

    def on_epoch(e: EpochResult) -> None:
        if recorder is not None:  # rank 0 checkpoints, records, and stops a diverged run (aborting the world)
            precision = None
            if len(ds.y_test):
                precision = float(model.correct(layout.views(params), x_test, y_test)) / len(ds.y_test)
            if checkpoints and e.epoch < cfg.epochs:  # before the metrics: a kill between them loses none
                done = e.first_iteration + len(e.losses)
                acc = np.nan if precision is None else precision
                state = (backend.to_host(params), e.epoch, done, recorder.run_id, key)
                saved = checkpoint.Checkpoint(*state, e.losses, e.batch_sizes, e.seconds, acc, snapshot_on_host())
                checkpoint.save(checkpoints, saved)
            if e.epoch == 1 and clock.first_start is not None:
                recorder.metric(metrics.TIME_TO_FIRST_BATCH, clock.first_start - origin)
            record_epoch(recorder, e, precision)
            console.epoch_line(e.epoch, cfg.epochs, e.mean_loss, precision, e.seconds)
            last.update(loss=e.mean_loss, precision=precision)
            if cfg.check.divergence == Divergence.stop:
                check_finite(e)
        if e.epoch < cfg.epochs and requeue.warned(world.comm):  # every rank, together
            raise TimeLimitReached(e.epoch, cfg.epochs)

    last: dict[str, float | None] = {}
    fault = cfg.fault.iteration if cfg.fault.rank == world.rank else None
    rank, size = world.rank, world.size
    exclusive = cfg.perf.timing == Timing.exclusive
    span = contextlib.nullcontext() if recorder is None else for_run(cfg.mlflow.run_name, exclusive, size, backend.kind)
    with span:  # the batches timed: the host's lock held, what else ran meanwhile noted
        parallel.wait_for_all(world.comm)  # every rank starts its clock once rank 0 has the host
        fit(
            step.build(options, xp, layout, params, schedule.batch_size, size, allreduce),
            *(xp, params, x_train, y_train, schedule, rank, size, clock, on_epoch, fault),
            fault_kind=cfg.fault.kind.value,
            start_epoch=1 if ckpt is None else ckpt.epoch + 1,
            snapshot=snapshot,
        )
        # perf.repeats: the first epoch timed again on scratch weights, on every rank (the sums are collective).
        repeat_ms = [clock.medians()["batch"]]  # r = 0: the training run's own median
        first_epoch = replace(schedule, epochs=1)
        for _ in range(cfg.perf.repeats - 1):  # each on a scratch copy of the initial weights
            repeat_clock = PhaseClock(STEP_PHASES, gpu=on_gpu)
            scratch = xp.array(init)
            scratch_step = step.build(options, xp, layout, scratch, schedule.batch_size, size, allreduce)
            fit(scratch_step, xp, scratch, x_train, y_train, first_epoch, rank, size, repeat_clock)
            repeat_ms.append(repeat_clock.medians()["batch"])
    if recorder is None:
        return None
    record_beside(recorder, span)
    if steps and job is None:  # on the CPU, after the timed batches: it would take their cores
        job = start_reference(cfg, layout, schedule, init, ds, steps)
    if allreduce.window_state is not None:  # known once fit has asked it for the gradient's buffer
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
    if cfg.save.weights:
        recorder.log_npz("weights_initial.npz", dict(zip(model.NAMES, layout.views(init))))
        recorder.log_npz("weights_final.npz", dict(zip(model.NAMES, layout.views(final))))
    if job is not None:
        recorder.set_tags({metrics.TAG_CHECK: "pending"})
    recorder.finish("FINISHED", close=job is None)  # the run ends with its training; its check may land later
    checkpoint.remove(cfg.save.checkpoint_dir)  # nothing left to resume
    console.summary(recorder.run_id, recorder.uri, rows)
    checked = final if snapshot is None else snapshot_on_host()
    return PendingCheck(job, on_gpu, recorder, layout, checked, steps)
