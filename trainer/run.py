"""One training run: validate, start the ranks, train, check against the reference, record.

run -> data (trainer/data.py) -> model (model.py, the step: step.py) -> loop (loop.py) -> record (record.py)
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any

from omegaconf import DictConfig

from trainer import data as data_mod
from trainer import limits, metrics, step
from trainer.config import Timing, validate
from trainer.core import model, reference
from trainer.core.clock import PhaseClock, process_start
from trainer.core.loop import STEP_PHASES, DivergedError, Schedule, Snapshot, fit
from trainer.core.timing import Protocol
from trainer.errors import ConfigError
from trainer.gpu import policy
from trainer.lifecycle import faults, launch, reference_jobs, requeue
from trainer.lifecycle.check import PendingCheck, first_weights, steps_checked
from trainer.lifecycle.check import start as start_reference
from trainer.lifecycle.epoch_end import EpochEnd
from trainer.lifecycle.progress import StopRequested
from trainer.lifecycle.requeue import KILLED_STATUS, TimeLimitReached
from trainer.lifecycle.timing_pass import measure_run
from trainer.options import StepOptions
from trainer.ranks import parallel, sigterm
from trainer.ranks.allreduce import make_allreduce
from trainer.ranks.backend import Backend, gpu_count, no_gpu, pinned, select
from trainer.ranks.contention import CoreWait, for_run, worst_wait
from trainer.ranks.sigterm import Terminated
from trainer.record import checkpoint, store, tracking
from trainer.record.run_record import (
    finish_run,
    record_beside,
    record_performance,
    record_resources,
    resume_recording,
    start_recording,
)
from trainer.record.uri_check import check_uri


def main(cfg: DictConfig, argv: list[str]) -> int:
    """Entry point: returns the process exit status. ``argv`` (the CLI's) re-creates cfg in each rank."""
    try:
        validate(cfg)
        os.environ.update(policy.tf32_env(cfg.gpu.gemm.value))  # the ranks inherit it
        has_gpu = cfg.device.value != "cpu" and gpu_count() > 0
        if cfg.device.value == "gpu" and not has_gpu:  # before any rank starts or run is recorded
            raise no_gpu()
        policy.check_gpu_keys(cfg, has_gpu)
        if not parallel.launched_by_mpi():  # the launching process: before any rank starts
            check_uri(store.tracking_uri(cfg.mlflow.tracking_uri))
            store.experiment_name(cfg.mlflow.experiment)
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


def train_and_record(
    cfg: DictConfig, world: parallel.World, ds: data_mod.Dataset, *, origin: float | None = None
) -> int:
    """Run on every rank; 0, 1 (FAILED) or KILLED_STATUS. Rank 0 then waits for the run's CPU check."""
    outcome = train_and_defer(cfg, world, ds, origin=origin)
    return outcome.finish() if isinstance(outcome, PendingCheck) else outcome


def train_and_defer(
    cfg: DictConfig,
    world: parallel.World,
    ds: data_mod.Dataset,
    *,
    origin: float | None = None,
    handoff: bool = False,
) -> int | PendingCheck:
    """Run on every rank: 1 (FAILED) or KILLED_STATUS if training failed, else 0 on ranks > 0 and on
    rank 0 the ended run's check still to land (:class:`PendingCheck`). Rank 0 records; a failure ends
    the run and, in a world of several ranks (the others may wait in a collective), aborts the world.
    ``handoff`` (a warm worker's point): a run on a SQLite store, without checkpoints, goes to a
    journal in ``mlflow.spool_dir`` that the sweeper sends (trainer/record/tracking.py)."""
    uri = store.tracking_uri(cfg.mlflow.tracking_uri)
    recorder: tracking.Recorder | None = None
    run_id: str | None = None
    handed_off = handoff and store.opens_in_background(uri) and not cfg.save.checkpoint_dir
    journal_dir = cfg.mlflow.spool_dir if handed_off else None  # the run's journal, which the sweeper sends
    sigterm.install()
    requeue.arm()
    try:
        backend = select(cfg.device, world.local_rank, world.local_size)
        options = policy.step_options(cfg, backend.kind)  # the step's options, resolved once
        hosts = world.comm.gather(socket.gethostname())
        devices = world.comm.gather(backend.describe())  # each rank's own GPU (or cpu), on its node
        key = checkpoint.resume_key(cfg)  # rank 0 reads, the others get it: one view of the folder
        ckpt = world.comm.bcast(checkpoint.load(cfg.save.checkpoint_dir, key) if world.rank == 0 else None)
        if world.rank == 0 and ckpt is not None:  # a requeued or restarted job: the same run goes on
            recorder = resume_recording(uri, ckpt, hosts, cfg)
            run_id = recorder.run_id
        elif world.rank == 0:
            # Alone, rank 0 creates the run while it trains; other ranks need its id before (to record a
            # failure), unless it is a journal (their failure goes there).
            background = world.size == 1 and store.opens_in_background(uri)
            recorder = start_recording(cfg, uri, world, backend, hosts, background, journal_dir)
            run_id = None if background or journal_dir else recorder.run_id
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
    except StopRequested as e:  # a search pruned it: every rank stopped at the same epoch, the next point comes
        if recorder is not None:
            recorder.set_tags({metrics.TAG_STOPPED: str(e)})
            recorder.finish("KILLED")
        return 0
    except BaseException as e:
        if isinstance(e, TimeLimitReached):  # every rank stopped at the same epoch: rank 0 says so
            if world.rank == 0:
                _record_failure(e, uri, run_id, recorder, 0, traced=False)
            return requeue.REQUEUE_STATUS if e.requeue else 1
        traced = not isinstance(e, (DivergedError, ConfigError))  # said in a line of their own: no traceback
        status = _record_failure(e, uri, run_id, recorder, world.rank, traced, journal_dir)
        if world.size > 1:
            if world.rank > 0 and status == KILLED_STATUS:
                _let_rank_0_record()
            world.abort(1)  # the other ranks may wait in a collective: end them all now
        return status


# A stop reaches every rank (scancel, Ctrl-C, a sweeper's clean-up), and rank 0 records the run
# KILLED, then ends the world. Another rank ending it first killed rank 0 halfway through that
# record. The wait is bounded: a signal that reached one rank alone (a drill, a `kill` of one pid).
RANK_0_RECORDS_S = 5.0


def _let_rank_0_record() -> None:
    """Wait for rank 0 to record the stop and end the world (this rank with it), at most RANK_0_RECORDS_S."""
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: end the world now
        time.sleep(RANK_0_RECORDS_S)


def rank_devices(hosts: list[str], devices: list[str]) -> str:
    """Which node and device each rank trained on: ``0=node1/gpu0 (NVIDIA H100 ...); 1=node1/gpu1 (...)``."""
    return "; ".join(f"{r}={host}/{device}" for r, (host, device) in enumerate(zip(hosts, devices)))[:5000]


def _record_failure(
    e: BaseException,
    uri: str,
    run_id: str | None,
    recorder: tracking.Recorder | None,
    rank: int,
    traced: bool = True,
    journal_dir: str | None = None,
) -> int:
    """End the run FAILED, or KILLED on Ctrl-C, SIGTERM or a time limit it will resume from, with
    the error; returns the status. ``journal_dir``: a handed-off run's journal, where the other ranks
    record."""
    killed = isinstance(e, (KeyboardInterrupt, Terminated)) or sigterm.seen() or getattr(e, "requeue", False)
    status = "KILLED" if killed else "FAILED"
    if isinstance(e, (KeyboardInterrupt, Terminated)):  # a stop asked for, not a fault: its cause, no traceback
        traced = False
    text = traceback.format_exc() if traced else f"{type(e).__name__}: {e or 'interrupted (SIGINT)'}"
    print(f"[rank {rank}] run {status}:\n{text}", file=sys.stderr, flush=True)
    if run_id is not None or (recorder is not None and recorder.handed_off):
        try:
            if recorder is not None:  # its queued metrics first, and through its journal if it keeps one
                recorder.fail(status, text, rank)
            else:
                tracking.mark_ended(uri, run_id, status, text, rank)
        except Exception as record_error:  # the store may be what failed
            print(f"[rank {rank}] could not record the failure: {record_error}", file=sys.stderr)
    elif journal_dir is not None and rank > 0 and status == "FAILED":  # rank 0 records its own, and a stop
        tracking.journal_ended(journal_dir, status, text, rank)
    return KILLED_STATUS if status == "KILLED" else 1


@dataclass(frozen=True)
class RankSetup:
    """What one rank trains with, made once before its first batch (``set_up``)."""

    xp: Any  # numpy or cupy
    on_gpu: bool
    layout: model.Layout
    init: Any  # the first weights on the host: the reference's and the artifact's
    schedule: Schedule
    params: Any  # the weights this rank trains, on its device (a checkpoint's on a resume)
    train: tuple[Any, Any]  # (x, y) where the step reads them (placed)
    test: tuple[Any, Any]
    options: StepOptions  # without graphs where the sums cannot be captured
    allreduce: Any  # trainer/ranks/allreduce.py make_allreduce
    overlap: bool  # the sums overlapped with the compute (NCCL alone can)

    def step(self, weights: Any, world_size: int) -> Any:
        """The step a fit of ``weights`` takes (trainer/step.py)."""
        return step.build(self.options, self.xp, self.layout, weights, self.schedule.batch_size, world_size,
                          self.allreduce)  # fmt: skip


def set_up(
    cfg: DictConfig,
    options: StepOptions,
    world: parallel.World,
    backend: Backend,
    ds: data_mod.Dataset,
    ckpt: checkpoint.Checkpoint | None,
) -> RankSetup:
    """The rank's weights, data, sums and step options, before its clock starts."""
    xp = backend.xp
    layout, init = first_weights(cfg, ds.n_features)
    params = xp.array(init if ckpt is None else ckpt.params)  # a copy: init is kept for the reference and the artifact
    allreduce = make_allreduce(
        options.comm, world, backend.kind == "gpu", backend.n_devices, xp, layout.size + 1, params.dtype,
        beside_gemm=options.beside_gemm, window=options.nccl_window,
    )  # fmt: skip
    if options.graph and not allreduce.capturable:  # gpu.comm=mpi: its sums pass through the host
        options = replace(options, graph=False)
    train, test = placed(cfg, ds, backend)
    overlap = options.overlap and allreduce.overlaps
    return RankSetup(xp, backend.kind == "gpu", layout, init, schedule_of(cfg), params, train, test, options,
                     allreduce, overlap)  # fmt: skip


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
    held_from = time.perf_counter()  # the devices are the run's from here (GPU-seconds)
    if ckpt is not None:  # and were in the job's earlier runs, up to its checkpoint
        held_from -= ckpt.held_s
    run = set_up(cfg, options, world, backend, ds, ckpt)
    xp, params, schedule, layout, (x, y) = run.xp, run.params, run.schedule, run.layout, run.train
    clock = PhaseClock(STEP_PHASES, gpu=run.on_gpu, nvtx=options.profile)
    steps = steps_checked(cfg, len(ds.y_train), schedule)  # the check compares the first `steps`
    snapshot = Snapshot(steps) if 0 < steps < reference.steps_of("all", len(ds.y_train), schedule) else None
    if snapshot is not None and ckpt is not None and ckpt.snapshot.size:  # taken before the job was requeued
        snapshot.weights = ckpt.snapshot
    job = None
    if recorder is not None:
        recorder.set_tags(run.options.tags(type(run.allreduce).__name__, run.overlap))
        if steps:
            recorder.set_tags({metrics.TAG_CHECK_STEPS: str(steps)})
        if steps and run.on_gpu:  # beside the GPU's training, on CPU cores it leaves idle
            job = start_reference(cfg, layout, schedule, run.init, ds, steps)
    resume_key = checkpoint.resume_key(cfg) if recorder is not None and cfg.save.checkpoint_dir else ""
    origin = process_start() if origin is None else origin
    end = EpochEnd(
        cfg, world.comm, recorder, backend.to_host, layout, params, run.test, clock, origin, snapshot, resume_key,
        training_s=0.0 if ckpt is None else ckpt.training_s, held_from=held_from,
    )  # fmt: skip

    def time_epochs(epochs: int) -> PhaseClock:  # the timing pass: steps on a scratch copy, the run's weights kept
        timed, scratch = PhaseClock(STEP_PHASES, gpu=run.on_gpu), params.copy()
        fit(run.step(scratch, world.size), xp, scratch, x, y, replace(schedule, epochs=epochs), world.rank,
            world.size, timed)  # fmt: skip
        return timed

    exclusive, name = cfg.perf.timing == Timing.exclusive, cfg.mlflow.run_name
    span = contextlib.nullcontext() if recorder is None else for_run(name, exclusive, world.size, backend.kind)
    with span, step.stream_for(run.options):  # the batches timed: the host's lock held, what else ran meanwhile noted
        parallel.wait_for_all(world.comm)  # every rank starts its clock once rank 0 has the host
        waiting = CoreWait()  # and what else ran on its cores
        training_step = run.step(params, world.size)
        fit(training_step, xp, params, x, y, schedule, world.rank, world.size, clock, end,
            before_step=faults.hook(cfg.fault, world.rank), start_epoch=1 if ckpt is None else ckpt.epoch + 1,
            snapshot=snapshot)  # fmt: skip
        batches = -(-len(ds.y_train) // schedule.batch_size)
        measured = measure_run(clock, protocol_of(cfg), batches, world.comm, time_epochs)
        waited = waiting.share()
    # A GPU computes on while its rank's thread waits: only CPU ranks' waits are theirs.
    core_wait = None if run.on_gpu else worst_wait(world.comm, waited)
    if recorder is None:
        return None
    record_resources(recorder, backend.kind, world.size, time.perf_counter() - held_from, end.training_s)
    record_beside(recorder, span, core_wait)
    if steps and job is None:  # on the CPU, after the timed batches: it would take their cores
        job = start_reference(cfg, layout, schedule, run.init, ds, steps)
    if run.options.graph:  # the phases the training replayed as CUDA graphs (none: a run of one epoch)
        recorder.set_tags({metrics.TAG_GRAPHS: str(training_step.captured)})
    if run.allreduce.window_state is not None:  # known once fit has asked it for the gradient's buffer
        recorder.set_tags({"sweepscale.nccl_window": run.allreduce.window_state})
    phase_ms = {**measured.phases, "batch": measured.batch_ms}
    record_performance(recorder, cfg, layout, backend, phase_ms, world.size, run.overlap, options=run.options,
                       comm=run.allreduce.via, n_train=len(ds.y_train), measured=measured)  # fmt: skip
    final = backend.to_host(params)
    finish_run(cfg, recorder, layout, run.init, final, end.last, measured.batch_ms, world.size, backend, job)
    checked = final if snapshot is None else end.snapshot_on_host()
    return PendingCheck(job, run.on_gpu, recorder, layout, checked, steps)


def protocol_of(cfg: DictConfig) -> Protocol:
    """The run's timing protocol (perf.*, trainer/core/timing.py)."""
    p = cfg.perf
    return Protocol(p.repeats, p.warmup, p.min_batches, p.min_seconds)


def placed(cfg: DictConfig, ds: data_mod.Dataset, backend: Backend) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """The training and test sets where the step reads them: on the device, or, the course's way
    (data.on_device=false on a GPU), the training set in pinned host memory, a batch copied at a time."""
    xp = backend.xp
    if cfg.data.on_device or backend.kind != "gpu":
        train = (xp.asarray(ds.x_train), xp.asarray(ds.y_train))
    else:
        train = (pinned(ds.x_train), pinned(ds.y_train))
    return train, (xp.asarray(ds.x_test), xp.asarray(ds.y_test))
