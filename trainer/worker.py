"""A warm worker: ranks that start once and train many points, one after another.

    python -m trainer.worker QUEUE --name W [--nproc N] [--mpiexec PATH]

QUEUE is a folder of ``todo/<n>`` files, each holding the folder of one point (its config, as a
cold job would run it); the sweeper may start workers before it writes them (their start-up
overlaps its own), and they wait for the queue's seal, the sign that every ticket is there (or
for the end of the sweeper that owns the queue); a search's queue streams: its tickets come
while the workers train, and an idle worker waits for the next one (outside its lease) until the
seal. Rank 0 claims the next ticket by renaming it to
``claimed/<n>.<W>`` (atomic, so workers sharing a queue never take one point twice), the ranks
train it with MPI, CuPy, MLflow and the data already loaded, and rank 0 writes ``result.json`` in
the point's folder once the point's run has ended and its CPU check has landed. A run ends with
its training; on a GPU its check (the reference computed beside, trainer/lifecycle/check.py) lands in it
later, while the worker trains the next points. The worker ends when the queue is sealed and
empty and every check has landed. Workers that share GPUs (the local runner's) hold them only
while they train a point, and CPU workers their cores (trainer/ranks/lease.py).

A point that fails on a world of one rank ends FAILED and the worker takes the next; on several
ranks the failing rank aborts the world (the others may wait in a collective) and the sweeper
starts a fresh worker for what is left. A point that ends KILLED (SIGTERM: Ctrl-C, scancel)
ends the worker too.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from trainer.errors import disk_full
from trainer.gpu import policy
from trainer.lifecycle import queue_files, requeue
from trainer.lifecycle.requeue import KILLED_STATUS
from trainer.ranks import lease as leases
from trainer.ranks import parallel, sigterm
from trainer.ranks.processes import run_then_exit
from trainer.record import journal
from trainer.warm_up import say, warm_up
from trainer.worker_points import Datasets, load_point, prefetch_checks

HANDOVER_S = 2.0  # at most this long, a worker waits for its first references to be in their children


def requeued(status: int) -> bool:
    """The point stopped for its job to run again (trainer/lifecycle/requeue.py): it gets no result now."""
    return status == requeue.REQUEUE_STATUS or (status == KILLED_STATUS and requeue.by_slurm())


def load_ahead(queue: Path, datasets: Datasets) -> None:
    """The data set the sweeper names, loaded; on rank 0 of a GPU worker, the CPU references of a
    grid's first points started (the configs the queue holds before its tickets). Done before MPI
    starts and the GPU warms up, which the references then overlap on the cores they leave."""
    from trainer.lifecycle import reference_jobs
    from trainer.ranks.backend import visible_gpus

    first = parallel.launcher_rank() == 0  # MPI's rank, known before MPI starts
    ahead = sorted((queue / queue_files.AHEAD).glob("*.json")) if first else []
    if ahead and visible_gpus():
        reference_jobs.warm()  # their processes import NumPy while the data set loads
    datasets.preload(os.environ.get(queue_files.DATA_HINT))  # while the sweeper records the sweep
    if first:
        say(f"data loaded, {len(datasets.loaded)} set(s)")
    if ahead and (started := prefetch_checks(ahead, datasets)):
        reference_jobs.handed_over(started, HANDOVER_S)  # before MPI's start holds the GIL
        say(f"{len(started)} reference(s) started")


def serve(queue: Path, name: str, world: parallel.World, datasets: Datasets) -> int:
    """Train the queue's points until it is empty (0) or a point ended KILLED (its status)."""
    from trainer.lifecycle import reference_jobs

    worker = f"{name}@{socket.gethostname()}:{os.getpid()}"
    waiting: list[tuple[Path, float, Any]] = []  # rank 0's trained points whose check is still computing
    served: set[Path] = set()  # the points this process claimed
    full = ""
    try:
        return _serve(queue, name, world, datasets, worker, waiting, served)
    except BaseException as e:
        full = disk_full(e)
        raise
    finally:  # SIGTERM, Ctrl-C or a bug: the runs ended FINISHED with their training; their checks are abandoned
        for point_dir, claimed_at, pending in waiting:
            pending.abandon()
            queue_files.write_result(point_dir, 0, worker, time.time() - claimed_at)
        reference_jobs.shutdown()
        # A full disk: its sweeper, writing there too, would fail to send them (30 s waited for nothing).
        _send_handed_off(queue, served, wait=not full)


def _send_handed_off(queue: Path, served: set[Path], wait: bool = True) -> None:
    """The runs this worker handed off, sent: by its sweeper, which polls them, or, that sweeper
    gone or silent for journal.HANDOFF_WAIT_S (journal.STOPPED_WAIT_S once it stopped this worker),
    by this worker (importing MLflow only then). A run whose point started before its sweep's
    parent run existed waits for the parent while the sweeper lives (its MLflow import, seconds; at
    most journal.PARENT_WAIT_S more), unless the sweeper stopped this worker (SIGTERM: the sweep
    failed or was interrupted, no parent comes). Without ``wait``, this worker sends them at once."""
    begun = time.monotonic()

    def left() -> list[Path]:  # a tracking server's journals (a run id known) are not this wait's
        return [d for d in served if (d / journal.FILE).exists() and journal.Journal(d).handed_off()]

    def waiting() -> bool:
        runs, waited = left(), time.monotonic() - begun
        if not runs or sigterm.seen():
            return bool(runs) and waited < journal.STOPPED_WAIT_S
        parentless = any(journal.Journal(d).awaits_parent() for d in runs)
        return waited < journal.HANDOFF_WAIT_S + (journal.PARENT_WAIT_S if parentless else 0)

    if wait and left():  # (wait_for ends early where the sweeper, on this host, is gone)
        queue_files.wait_for(queue, lambda: not waiting())
    for point_dir in left():
        for path, what in journal.send_left(point_dir):
            print(f"worker: run of {path.parent.name} {what}", file=sys.stderr, flush=True)


def _serve(
    queue: Path, name: str, world: parallel.World, datasets: Datasets, worker: str, waiting: list, served: set[Path]
) -> int:

    tf32 = policy.tf32_here()  # one GEMM mode per worker
    lease = leases.from_env(world.local_rank)
    if not queue_files.wait_sealed(queue):
        return 0
    stream = queue_files.streaming(queue)
    if world.rank == 0 and not (queue / queue_files.AHEAD).is_dir():  # a search's first trials
        tickets = sorted((queue / queue_files.TODO).iterdir())
        prefetch_checks([Path(t.read_text().strip()) / queue_files.POINT_DATA for t in tickets], datasets)
    while True:
        if _settle(waiting, worker, block=False) == KILLED_STATUS:
            return KILLED_STATUS
        # warned: the job's restart serves the rest
        if requeue.warned(world.comm) and requeue.requeues_left() > 0:
            return _settle(waiting, worker, block=True) or requeue.REQUEUE_STATUS
        if stream and not _next_ticket(queue, name, world, waiting, worker):  # a search's: not holding the lease
            return _settle(waiting, worker, block=True)
        if lease is not None:
            lease.acquire(world.comm)
        try:
            status = _next_point(queue, name, world, worker, waiting, datasets, tf32, served)
        finally:  # trained (its run may wait for the reference: no GPU needed), or failed
            if lease is not None:
                lease.release()
        if status is None and (
            not stream or parallel.share(world.comm, queue_files.sealed(queue) if world.rank == 0 else None)
        ):
            return _settle(waiting, worker, block=True)  # the last points' references
        # (a search's queue, not sealed: another worker took the ticket; wait for the next)
        if status == requeue.REQUEUE_STATUS:  # the point resumes from its checkpoint after the requeue
            return _settle(waiting, worker, block=True) or status
        if status == KILLED_STATUS or sigterm.seen():  # SIGTERM: serve no other point
            return KILLED_STATUS


def _next_ticket(queue: Path, name: str, world: parallel.World, waiting: list, worker: str) -> bool:
    """A streaming queue's worker, between points: rank 0 waits for a ticket or the seal, landing
    its checks meanwhile (their results are what the search waits for); False: the sweeper is gone,
    or released this worker."""
    ok = True
    if world.rank == 0:
        ok = queue_files.wait_ticket(queue, lambda: _settle(waiting, worker, block=False), name)
    return bool(parallel.share(world.comm, ok))  # the other ranks asleep meanwhile


def _next_point(
    queue: Path,
    name: str,
    world: parallel.World,
    worker: str,
    waiting: list,
    datasets: Datasets,
    tf32: bool,
    served: set[Path],
) -> int | None:
    """Claim and train the next point: None when the queue is empty, else the point's status
    (0 also for a run that waits for its reference)."""
    from omegaconf import open_dict

    from trainer import metrics
    from trainer.config import Gemm
    from trainer.errors import ConfigError
    from trainer.lifecycle.check import PendingCheck
    from trainer.run import train_and_defer

    point_dir = queue_files.claim(queue, name, served) if world.rank == 0 else None
    claimed_at = time.time()
    point_dir = parallel.share(world.comm, point_dir)  # rank 0 may still record the last point
    if point_dir is None:
        return None
    status, error = 0, ""
    try:
        cfg = load_point(point_dir)  # typed by the schema; its values validated once, by the sweeper's plan
        if cfg.nproc != world.size:
            raise ConfigError(f"nproc={cfg.nproc} but this worker has {world.size} ranks")
        if (cfg.gpu.gemm == Gemm.tf32) != tf32:
            raise ConfigError(f"gpu.gemm={cfg.gpu.gemm.value}: this worker's {policy.TF32_ENV} says otherwise")
        with open_dict(cfg):
            cfg.mlflow.tags = {**cfg.mlflow.tags, metrics.TAG_WARM: "true", metrics.TAG_WORKER: worker}
        ds = datasets.get(cfg)
    except Exception:  # the sweeper checked every point: this is a bug, the point fails alone
        status, error = 2, traceback.format_exc()
    if not status:
        outcome = train_and_defer(cfg, world, ds, origin=claimed_at, handoff=os.environ.get(journal.HANDOFF_ENV) == "1")
        if isinstance(outcome, PendingCheck):  # rank 0: result.json once the run has ended
            queue_files.write_trained(point_dir)  # its training and metrics are in: a search asks for the next trial
            waiting.append((point_dir, claimed_at, outcome))
            if not outcome.beside:  # trained on the CPU: the next point must not share its cores
                return _settle(waiting, worker, block=True)
            return 0
        status = outcome
    if world.rank == 0 and not requeued(status):  # a requeued point has no result yet: it resumes
        if error:
            (point_dir / "worker_error.txt").write_text(error)
        queue_files.write_result(point_dir, status, worker, time.time() - claimed_at)
    return status


def _settle(waiting: list[tuple[Path, float, Any]], worker: str, block: bool) -> int:
    """Log the checks whose reference is there (with ``block``, wait for all of them) and write their
    points' results; KILLED_STATUS once a SIGTERM came (the worker serves no other point), else 0."""

    for item in [w for w in waiting if block or w[2].done()]:
        waiting.remove(item)  # first: a SIGTERM from here on must not abandon a check that landed
        point_dir, claimed_at, pending = item
        status = pending.finish()
        queue_files.write_result(point_dir, status, worker, time.time() - claimed_at)
    return KILLED_STATUS if sigterm.seen() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("queue", type=Path)
    parser.add_argument("--name", default="w0", help="this worker's name in the queue's claims")
    parser.add_argument("--nproc", type=int, default=1, help="ranks (every point in the queue has this nproc)")
    parser.add_argument("--mpiexec", default=None, help="the mpiexec to start the ranks with")
    args = parser.parse_args(argv)
    if args.nproc > 1 and not parallel.launched_by_mpi():
        mpiexec = parallel.find_mpiexec(args.mpiexec)
        return parallel.run_under_mpiexec(mpiexec, args.nproc, sys.argv[1:], module="trainer.worker")
    sigterm.install()  # before its first point too: a SIGTERM a library swallows still stops the worker
    requeue.arm()  # a warning between points: the worker ends and its requeued job serves the rest
    queue, datasets = args.queue.resolve(), Datasets()
    from trainer.lifecycle import reference_jobs
    from trainer.ranks.sigterm import Terminated

    try:
        world = warm_up(args.nproc, before_mpi=lambda: load_ahead(queue, datasets))
        _say(world, "warmed up")
        return serve(queue, args.name, world, datasets)
    except (KeyboardInterrupt, Terminated):  # SIGTERM or Ctrl-C between points: no run to end
        return KILLED_STATUS
    finally:  # references started ahead of a warm-up that was interrupted
        reference_jobs.shutdown()


def _say(world: parallel.World, what: str) -> None:
    """Where the worker's start-up stands, in its log (rank 0's)."""
    if world.rank == 0:
        say(what)


if __name__ == "__main__":
    # A rank ends the usual way: ended at once, its world was now and then killed by MPICH's mpiexec.
    if parallel.launched_by_mpi():
        sys.exit(main())
    run_then_exit(main)  # without Python's teardown: half a second of CPU a worker
