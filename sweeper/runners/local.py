"""Points as local submitit jobs on this machine; each job starts its ranks with mpiexec.

Warm (``launcher.warm``, the default): a job is a worker that serves a queue of points of one
shape (sweeper/runners/warm.py). Workers start before the sweep's runs are recorded, their
start-up beside the sweeper's. Every shape's workers start at once (nproc=1: one per GPU, or
core; nproc=2: one per pair) and share the GPUs or cores, each holding its own only while it
trains a point (trainer/ranks/lease.py): start-up overlaps, training never does. On CPU cores,
workers beyond each shape's first start only while all their ranks fit the cores. Cold (a job per
point), jobs start while GPUs or cores are free: never oversubscribed, never shared, and what
does not fit waits for a release.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sweeper.display import console
from sweeper.job.point_job import run_point, run_worker
from sweeper.points import Point, Shape
from sweeper.runners.base import MachineTooSmallError, WithoutScheduler
from sweeper.runners.warm import Queue, Ticket, WarmPool, unstarted
from trainer.lifecycle.reference_jobs import CORES_ENV
from trainer.ranks import lease
from trainer.ranks.backend import blas_threads, no_gpu, visible_gpus

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from sweeper.runners.base import Job


class LocalRunner(WithoutScheduler):
    scheduler: ClassVar[str] = "local"
    checkpoints: ClassVar[bool] = False  # nothing restarts a local job: no epoch pays for a checkpoint
    ranks_start: ClassVar[str] = "mpiexec on this machine, its ranks on loopback"

    def __init__(self, launcher: DictConfig, folder: Path, job_name: str) -> None:
        self.launcher, self.folder = launcher, folder
        self.n_gpus = launcher.gpus if launcher.gpus is not None else visible_gpus()
        self.n_cpus = launcher.cpus if launcher.cpus is not None else (os.cpu_count() or 1)
        self.free_gpus = list(range(self.n_gpus))
        self.free_cpus = self.n_cpus
        self.held: dict[str, tuple[list[int], int]] = {}  # job id -> the GPUs and the CPU cores it holds
        self.executor = None
        self.pool = WarmPool(folder, launcher.max_restarts) if launcher.warm else None
        self.shared_said: set[int] = set()  # the nprocs whose ranks share the cores, said once
        self.streaming = False  # a search's (sweeper/search/flow.py): points come while the sweep runs
        self.submitted: dict[str, float] = {}  # a warm worker's job id -> when it was started (monotonic)
        self.slots: dict[
            tuple[Path, str], int
        ] = {}  # (queue, worker) -> which GPUs (or cores) of the machine it shares

    def shape(self, point: Point) -> Shape:
        """GPUs when the point runs on GPUs, else CPU cores; never more than this machine has."""
        if point.trainer.device.value == "gpu" and self.n_gpus == 0:
            raise MachineTooSmallError(str(no_gpu()))
        on_gpu = point.trainer.device.value != "cpu" and self.n_gpus > 0
        if on_gpu:
            have, what, fix = self.n_gpus, "GPUs", "lower nproc, or set launcher.gpus, or use launcher=slurm"
        else:
            have, what, fix = self.n_cpus, "CPU cores", "lower nproc, set launcher.cpus, or use launcher=slurm"
        if point.nproc > have and not on_gpu and self.launcher.oversubscribe:
            self._say_shared(point, have)
            return Shape(1, point.nproc, 0, shared_cores=have)
        if point.nproc > have:
            raise MachineTooSmallError(
                f"point {point.name}: nproc={point.nproc} needs {point.nproc} {what} but this machine has {have}; {fix}"
            )
        return Shape(1, point.nproc, int(on_gpu))

    def _say_shared(self, point: Point, have: int) -> None:
        """Once a nproc: its ranks will share the cores, and what that does to its timings."""
        if point.nproc not in self.shared_said:
            console.print(
                f"nproc={point.nproc} on {have} CPU core(s): its ranks share them (launcher.oversubscribe), "
                "its timings are flagged and not timed again"
            )
            self.shared_said.add(point.nproc)

    def check(self, points: list[Point]) -> None:
        pass  # the shapes already hold every point to this machine's GPUs and cores

    def preview(self, groups: dict[Shape, list[Point]]) -> dict[str, str]:
        return {}  # the table of points and resources says it all

    def stream(self) -> bool:
        """A search's points come while the sweep runs (base.Streaming): warm workers only."""
        self.streaming = self.pool is not None
        return self.streaming

    def units(self, shape: Shape) -> int:
        """The GPUs, or cores, points of this shape share: how many a search keeps in flight."""
        return self.n_gpus if shape.gpus_per_task else self.n_cpus

    def hands_off(self, points: list[Point]) -> bool:
        from trainer.warm_up import hands_off  # the workers' own rule, with the store and hand-off this sweep set

        return self.pool is not None and hands_off()

    def prestart(self, points: list[Point]) -> None:
        """Warm: open the queues and start their workers now; they wait for the tickets."""
        if self.pool is not None:
            if self.streaming:
                self.pool.put(points, tickets=False)
            else:
                self.pool.add(points, seal=False)
            self._start_workers()

    def end_stream(self) -> None:
        """A search asked for its last trial: its queues sealed, their workers end once idle."""
        if self.pool is not None:
            self.pool.end_streams()

    def start(self, queued: list[Point]) -> list[tuple[Point, Job]]:
        if self.pool is not None:
            return self._start_warm(queued)
        started = []
        for p in list(queued):  # in order; a point that does not fit now waits for a release
            if self._fits(p.nproc, p.shape):
                queued.remove(p)
                job = self._submit(p.shape, 1, run_point, str(p.dir))
                started.append((p, job))
        return started

    def _start_warm(self, queued: list[Point]) -> list[tuple[Point, Job]]:
        pool = self.pool
        self._end_unstarted()
        if self.streaming:  # a search's points: tickets as they come, the queues left open
            pool.put(queued)
        elif not pool.queues:
            pool.add(queued)
        else:
            pool.seal(queued)  # the queues prestart opened: their tickets now
        for q, name, job in pool.ended_workers():
            self._give_back(job)
            self.slots.pop((q.dir, name), None)
        self._start_workers()
        return pool.tickets(queued)

    def _start_workers(self) -> None:
        """Workers for the queues that can use more, in the sweep's order: one per free slot of the
        queue's shape (nproc GPUs, or cores, of the machine), sharing them under leases. On CPU
        cores a queue gets its first worker always, more only while all workers' ranks fit the
        cores: a CPU worker's start-up takes the cores the others start and train on."""
        for q in self.pool.queues:  # every shape's first worker
            if not q.live() and self.pool.needs_workers(q):
                self._start_worker(q)
        for q in self.pool.queues:  # then more, in the sweep's order
            for _ in range(self.pool.needs_workers(q)):
                if not self._start_worker(q):
                    break

    def _start_worker(self, q: Queue) -> bool:
        """One more worker for ``q`` on a free slot of its shape; False where none is free (or, on
        CPU cores, a queue's second or later worker's ranks would not fit beside the live workers')."""
        shape = q.points[0].shape
        kind, have = ("gpu", self.n_gpus) if shape.gpus_per_task else ("core", self.n_cpus)
        taken = {self.slots[(q.dir, n)] for n in q.live() if (q.dir, n) in self.slots}
        free = [s for s in range(max(1, have // q.nproc)) if s not in taken]  # more ranks than cores: one slot
        if not free or (q.live() and kind == "core" and self._cpu_ranks() + q.nproc > have):
            return False
        units = list(range(free[0] * q.nproc, min((free[0] + 1) * q.nproc, have)))
        name = self.pool.new_name()
        args = (str(q.dir), name, q.nproc, q.mpiexec)
        q.workers[name] = self._submit(shape, len(q.points), run_worker, *args, env=q.env, units=(kind, units))
        self.submitted[q.workers[name].job_id] = time.monotonic()
        self.slots[(q.dir, name)] = free[0]
        return True

    def _end_unstarted(self) -> None:
        """Warm workers whose job wrote no log ``launcher.start_grace_s`` after its start: its
        controller started no task (seen rarely: one cause, its job's folder made too late, is gone,
        local_jobs.py); ended (its session killed), so that the pool starts a fresh worker for its
        points at once."""
        grace = self.launcher.start_grace_s
        for job in self.pool.live_jobs():
            started = self.submitted.get(job.job_id)
            if started is None or time.monotonic() - started < grace or Path(job.paths.stdout).exists():
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(job.job_id), signal.SIGKILL)  # a session of its own (local_jobs.py): all of it
            unstarted(job.job_id, f"its job wrote no log {grace:g} s after its start: killed, a fresh worker started")
            del self.submitted[job.job_id]

    def _cpu_ranks(self) -> int:
        """The ranks of the live workers on CPU cores."""
        return sum(q.nproc * len(q.live()) for q in self.pool.queues if not q.points[0].shape.gpus_per_task)

    def _submit(
        self,
        shape: Shape,
        n_points: int,
        fn: Any,
        *args: Any,
        env: dict | None = None,
        units: tuple[str, list[int]] | None = None,
    ) -> Job:
        """Start the job; its time limit covers ``n_points`` points. ``units``: a warm worker's GPUs
        or cores, shared with other workers under leases; without, a job takes its GPUs or cores."""
        if self.executor is None:
            from sweeper.runners.local_jobs import LocalExecutor  # submitit: heavy, only once needed

            self.executor = LocalExecutor(folder=str(self.folder / "%j"))
        env = dict(env or {})
        ids, cpus = [], 0
        if not shape.gpus_per_task:  # a rank a core: its BLAS must not start a thread per core of the machine
            env.update(one_core_a_rank(min(shape.tasks_per_node, self.n_cpus)))
        if units is not None:
            kind, numbers = units
            if kind == "gpu":
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, numbers))
            (self.folder / "leases").mkdir(parents=True, exist_ok=True)
            env.update(lease.units_env(self.folder / "leases", [f"{kind}{n}" for n in numbers]))
        elif shape.gpus_per_task:
            ids, self.free_gpus = self.free_gpus[: shape.tasks_per_node], self.free_gpus[shape.tasks_per_node :]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
        else:
            cpus = min(shape.tasks_per_node, self.n_cpus)  # ranks sharing the cores hold them all
            self.free_cpus -= cpus
        self.executor.update_parameters(timeout_min=self.launcher.timeout_min * n_points)
        job = self.executor.submit(fn, *args, env)
        # Its controller writes the result before it exits: missing then, it never comes (submitit
        # waits 15 s for a shared file system's lag; a killed job's or a full disk's news came that late).
        job._results_timeout_s = 0
        self.held[job.job_id] = (ids, cpus)
        return job

    def _give_back(self, job: Job) -> None:
        ids, cpus = self.held.pop(job.job_id, ([], 0))
        self.free_gpus = sorted(self.free_gpus + ids)
        self.free_cpus += cpus

    def release(self, job: Job) -> None:
        if self.pool is None:  # a warm worker's resources come back when the worker ends
            self._give_back(job)

    def cancel(self, job: Job) -> None:
        """SIGTERM to the job's process (a local job's id is its pid), which passes it to the
        trainer and its ranks: they end their run KILLED and exit (a warm worker: its point's)."""
        target = job.worker if isinstance(job, Ticket) else job
        if target is not None:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(target.job_id), signal.SIGTERM)

    def stop(self) -> None:
        """The sweep is interrupted: end the workers too, idle ones included."""
        if self.pool is not None:
            self.pool.stopping = True
            for job in self.pool.live_jobs():
                self.cancel(job)

    def _fits(self, nproc: int, shape: Shape) -> bool:
        return nproc <= len(self.free_gpus) if shape.gpus_per_task else min(nproc, self.n_cpus) <= self.free_cpus


def one_core_a_rank(nproc: int) -> dict[str, str]:
    """The environment of CPU ranks that each own a core: one BLAS and OpenMP thread a rank, and the
    cores the job holds (trainer/lifecycle/reference_jobs.py shares them with the run's CPU check)."""
    return {**blas_threads(1), CORES_ENV: str(nproc)}
