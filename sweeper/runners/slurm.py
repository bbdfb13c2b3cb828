"""submitit's Slurm executor: one job array per shape, all submitted at once; Slurm queues them.

Warm (``launcher.warm``, the default): each array task is one allocation whose srun step is a
worker serving a chunk of ``points_per_job`` points (sweeper/runners/warm.py); its time limit
covers the chunk, and the arrays are submitted before the sweep's store is open (``prestart``),
their tickets once its parent run exists. Cold: one array task per point. What squeue and sacct
say of the jobs (pending reasons, requeues, allocations) is sweeper/runners/slurm_queue.py's.
How the ranks start fits the cluster (sweeper/runners/bootstrap.py): each task of a job's srun
step runs the job body and becomes one MPI rank through srun's PMI, or the job body runs once,
without srun, and starts the ranks with the MPI's mpiexec inside the allocation. The preview
renders the sbatch lines from the same parameters the executor is given (sweeper/runners/sbatch.py).
"""

from __future__ import annotations

import math
import subprocess
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sweeper.display import console
from sweeper.job.point_job import run_point, run_worker
from sweeper.points import Point, Shape
from sweeper.runners import bootstrap, partition, slurm_queue, warm
from sweeper.runners.base import SchedulerAwayError
from sweeper.runners.sbatch import sbatch_preview, share, slurm_parameters
from trainer.errors import ConfigError
from trainer.lifecycle import queue_files as protocol
from trainer.lifecycle import requeue
from trainer.ranks import parallel
from trainer.ranks.backend import blas_threads

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from sweeper.runners.base import Job


class SlurmRunner:
    scheduler: ClassVar[str] = "slurm"
    checkpoints: ClassVar[bool] = True  # requeues, preemption, time limits (trainer/lifecycle/requeue.py)

    def __init__(self, launcher: DictConfig, folder: Path, job_name: str) -> None:
        self.launcher, self.folder, self.job_name = launcher, folder, job_name
        self.pool = warm.WarmPool(folder, launcher.max_restarts) if launcher.warm else None
        self.job_a_point = self.pool is None
        self.streaming = False  # a search's (sweeper/search/flow.py): points come while the sweep runs
        self._partition: partition.Partition | None = None
        self.away: SchedulerAwayError | None = None  # Slurm does not answer here: a preview goes on without it
        self._bootstrap: bootstrap.Bootstrap | None = None
        self.watch = slurm_queue.JobsWatch(console.print)  # what squeue and sacct say of the jobs submitted

    def partition_limits(self) -> partition.Partition:
        """The partition's limits, asked of Slurm once (after its own word on a named partition)."""
        if self._partition is None:
            if not partition.answers():  # before any other command, each of which would wait for it
                raise partition.away("`scontrol ping` finds no controller")
            self._test_partition()
            self._partition = partition.read(self.launcher.partition)
        return self._partition

    def _test_partition(self) -> None:
        """``sbatch --test-only``: Slurm's own message for a partition that is missing or not ours."""
        name = self.launcher.partition
        if name is None:
            return
        cmd = ["sbatch", "--test-only", f"--partition={name}", "--wrap=true"]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise partition.away(f"sbatch: {e}") from None
        if result.returncode != 0:
            msg = result.stderr.strip() or result.stdout.strip()
            if not partition.answers():
                raise partition.away(f"sbatch: {msg.splitlines()[-1] if msg else result.returncode}")
            raise ConfigError(f"launcher.partition={name}: Slurm says: {msg}")

    def per_node(self, point: Point | None = None) -> tuple[int, int, int]:
        """Ranks and GPUs per node, and the most nodes a point spans: as configured, else the partition's
        (with GPUs, one rank per GPU; on CPUs, one per cpus_per_task of the node's CPUs). Where Slurm
        does not answer (a preview away from the cluster), what is not configured is assumed: all of
        ``point``'s ranks on one node, one GPU each unless it runs on the CPU."""
        launcher = self.launcher
        configured = (launcher.gpus_per_node, launcher.ranks_per_node, launcher.max_nodes)
        limits = self._limits() if None in configured else None
        nproc = point.nproc if point is not None else 1
        gpus = launcher.gpus_per_node
        if gpus is None and limits is not None:
            gpus = limits.gpus_per_node
        elif gpus is None:  # assumed: a GPU per rank, unless the point runs on the CPU
            gpus = 0 if point is not None and point.trainer.device.value == "cpu" else nproc
        ranks = gpus or launcher.ranks_per_node
        if ranks is None:
            ranks = max(1, limits.cpus_per_node // launcher.cpus_per_task) if limits else nproc
        nodes = launcher.max_nodes
        if nodes is None:
            nodes = limits.nodes if limits else 1
        return ranks, gpus, nodes

    def _limits(self) -> partition.Partition | None:
        """The partition's limits; None (and ``away`` says why) where Slurm does not answer."""
        if self.away is not None:
            return None
        try:
            return self.partition_limits()
        except SchedulerAwayError as e:
            self.away = e
            return None

    def shape(self, point: Point) -> Shape:
        """nproc ranks over ceil(nproc / ranks per node) nodes, evenly; one GPU each on GPUs."""
        per_node, gpus, max_nodes = self.per_node(point)
        capacity = per_node * max_nodes
        if point.nproc > capacity:
            raise ConfigError(
                f"point {point.name}: nproc={point.nproc} exceeds {max_nodes} node(s) x {per_node} ranks "
                f"= {capacity}; raise launcher.max_nodes or launcher.ranks_per_node/gpus_per_node, or lower nproc"
            )
        nodes = math.ceil(point.nproc / per_node)
        if point.nproc % nodes:
            raise ConfigError(
                f"point {point.name}: nproc={point.nproc} cannot be spread evenly over {nodes} nodes of {per_node} "
                "ranks; use a multiple of the node count"
            )
        exclusive = point.trainer.perf.timing.value == "exclusive"  # timed alone: no other job on its nodes
        return Shape(nodes, point.nproc // nodes, int(gpus > 0), exclusive)

    def check(self, points: list[Point]) -> None:
        """Choose how ranks start (the MPI and srun's plugins), ask the scheduler whether the partition
        exists (its own message if not), then hold the points to its limits: a job it can never
        start would pend forever. Where Slurm does not answer, SchedulerAwayError after the choice."""
        mpiexec = points[0].trainer.mpi.mpiexec if points else None
        self._bootstrap = bootstrap.detect(self.launcher.pmi.value, mpiexec, self.launcher.partition)
        if self.away is not None:
            raise self.away
        partition.check_request(self.launcher)  # account, qos, constraint: as sbatch would take them
        longest = max(Counter(p.shape for p in points).values()) if self.pool is not None else 1
        partition.check_limits(
            self.launcher, self.partition_limits(), self.per_node(), min(longest, self.launcher.points_per_job)
        )

    @property
    def ranks_start(self) -> str:
        return self.bootstrap.why

    @property
    def bootstrap(self) -> bootstrap.Bootstrap:
        """How ranks start: :meth:`check` chose it; before, an explicit srun plugin as configured."""
        if self._bootstrap is None:
            pmi = self.launcher.pmi.value
            if pmi in ("pmi2", "pmix"):
                return bootstrap.configured(pmi)
            self._bootstrap = bootstrap.detect(pmi, None, self.launcher.partition)
        return self._bootstrap

    def preview(self, groups: dict[Shape, list[Point]]) -> dict[str, str]:
        arrays = []
        for shape, members in groups.items():
            n_jobs, per_job = len(members), 1
            if self.pool is not None:
                per_job = min(self.launcher.points_per_job, len(members))
                n_jobs = math.ceil(len(members) / per_job)
            arrays.append((shape, n_jobs, per_job))
        shares = share(self.launcher.array_parallelism, [n_jobs for _, n_jobs, _ in arrays])
        out = {"how the ranks start": self.bootstrap.why}
        for (shape, n_jobs, per_job), at_once in zip(arrays, shares):
            title = f"job array for {shape.describe()}; {n_jobs} job(s) of {per_job} point(s)"
            out[title] = sbatch_preview(self.parameters(shape, per_job, at_once), self.folder / "%j", n_jobs)
        return out

    def parameters(self, shape: Shape, n_points: int = 1, at_once: int | None = None) -> dict[str, Any]:
        return slurm_parameters(self.launcher, shape, self.job_name, n_points, at_once, self.bootstrap.on(shape.nodes))

    def launch(self, shape: Shape) -> list[str] | None:
        """What starts a job's ranks where srun does not (launcher.pmi=mpiexec, or MPICH across nodes):
        the MPI's mpiexec."""
        how = self.bootstrap.on(shape.nodes)
        if how.srun:
            return None
        return [how.mpiexec or "mpiexec", "-n", str(shape.nodes * shape.tasks_per_node)]

    def hands_off(self, points: list[Point]) -> bool:
        return False  # its jobs create their runs: a requeued one goes on in it from its checkpoint

    def stream(self) -> bool:
        """A search's points come while the sweep runs (base.Streaming): warm allocations only."""
        self.streaming = self.pool is not None
        return self.streaming

    def units(self, shape: Shape) -> int:
        """How many trials a search keeps running: an allocation each, ``array_parallelism`` at once."""
        return self.launcher.array_parallelism

    def end_stream(self) -> None:
        """The search's last trial has ended: its queues sealed (their workers end once idle), and a
        worker that never took a trial, pending in Slurm's queue or not, cancelled: no allocation
        starts after the sweep for nothing."""
        if self.pool is None:
            return
        self.pool.end_streams()
        for q in self.pool.queues:
            served = set(q.claims().values())
            for name in [n for n in q.live() if q.streaming and n not in served]:
                self._let_go(q, name)

    def prestart(self, points: list[Point]) -> None:
        """Warm: the queues open and their allocations are asked for now, their tickets written by
        ``start`` once the parent run exists: Slurm's scheduling and the workers' start-up overlap
        MLflow's import and the parent's recording (on one GPU node 3.7 s of an 11.0 s sweep went
        to the job's wait and start after the parent). A search's first allocations likewise."""
        if self.pool is None:
            return
        if self.streaming:
            self.pool.put(points, tickets=False)
            self._start_streaming()
        else:
            self._submit_queues(self.pool.add(points, chunk=self.launcher.points_per_job, seal=False))

    def start(self, queued: list[Point]) -> list[tuple[Point, Job]]:
        if self.pool is not None:
            return self._start_warm(queued)
        started = []
        by_shape: dict[Shape, list[Point]] = {}
        for p in queued:
            by_shape.setdefault(p.shape, []).append(p)
        shares = share(self.launcher.array_parallelism, [len(todo) for todo in by_shape.values()])
        for (shape, todo), at_once in zip(by_shape.items(), shares):
            calls = [(run_point, str(p.dir), self.env(shape), self.launch(shape)) for p in todo]
            jobs = self._submit(shape, 1, calls, at_once, [[p.name] for p in todo])
            for p, job in zip(todo, jobs):
                queued.remove(p)
                started.append((p, job))
                console.print(f"slurm job {job.job_id} ({shape.describe()}): {p.name}")
        return started

    def _start_warm(self, queued: list[Point]) -> list[tuple[Point, Job]]:
        """Points not seen before are queued in chunks, one array per shape; later calls resubmit a
        chunk whose worker died with points left."""
        pool = self.pool
        if self.streaming:  # a search's trials: tickets as they come, the queues left open
            pool.put(queued)
            pool.ended_workers()
            self._release_idle()
            self._start_streaming()
            return pool.tickets(queued)
        pool.seal(queued)  # the queues prestart opened: their tickets now
        known = {p.index for q in pool.queues for p in q.points}
        new = [p for p in queued if p.index not in known]  # points no queue holds yet
        fresh = pool.add(new, chunk=self.launcher.points_per_job) if new else []
        pool.ended_workers()
        again = [q for q in pool.queues if q not in fresh and not q.live() and pool.needs_workers(q)]
        self._submit_queues(fresh + again)
        return pool.tickets(queued)

    def _submit_queues(self, queues: list[warm.Queue]) -> None:
        """A job array per shape, an allocation (a worker) per queue."""
        pool = self.pool
        by_shape: dict[Shape, list[warm.Queue]] = {}
        for q in queues:
            by_shape.setdefault(q.points[0].shape, []).append(q)
        shares = share(self.launcher.array_parallelism, [len(qs) for qs in by_shape.values()])
        for (shape, qs), at_once in zip(by_shape.items(), shares):
            names = [pool.new_name() for _ in qs]
            calls = [self._worker_call(q, n) for q, n in zip(qs, names)]
            jobs = self._submit(
                shape, max(len(q.points) for q in qs), calls, at_once, [[p.name for p in q.points] for q in qs]
            )
            for q, name, job in zip(qs, names, jobs):
                q.workers[name] = job
                console.print(f"slurm job {job.job_id} ({shape.describe()}): {', '.join(p.name for p in q.points)}")

    def _start_streaming(self) -> None:
        """An allocation (a worker) for each trial no worker will take soon, ``array_parallelism``
        at most at once; each serves its queue's trials until the search seals it."""
        pool = self.pool
        live = len(pool.live_jobs())
        for q in pool.queues:
            shape = q.points[0].shape
            for _ in range(pool.needs_workers(q)):
                if live >= self.launcher.array_parallelism:
                    return
                name = pool.new_name()
                call = self._worker_call(q, name)
                (job,) = self._submit(shape, self.launcher.points_per_job, [call], 1, [["search trials"]])
                q.workers[name] = job
                live += 1
                console.print(f"slurm job {job.job_id} ({shape.describe()}): a search's worker")

    def _worker_call(self, q: warm.Queue, name: str) -> tuple:
        """A warm worker's job body and its arguments: worker ``name`` serving queue ``q``."""
        shape = q.points[0].shape
        return (run_worker, str(q.dir), name, q.nproc, q.mpiexec, {**q.env, **self.env(shape)}, self.launch(shape))

    def _release_idle(self) -> None:
        """A search's worker with no trial in hand gives its allocation back while another shape's
        trials wait for a worker Slurm has not started: on a partition they fill, each would
        otherwise wait for the other. A later trial of its shape asks for a new allocation."""
        queues = [q for q in self.pool.queues if q.streaming and not q.sealed]
        waiting = [
            q
            for q in queues
            if len(q.ticketed) > len(q.claims())
            and all(q.workers[n].job_id in self.watch.pending_ids for n in q.live())
        ]
        if not waiting:
            return
        for q in queues:
            if q in waiting or not q.idle():
                continue
            for name in q.live():
                self._let_go(q, name)
                console.print(f"slurm job {q.workers[name].job_id}: no trial in hand, given back for another shape's")

    def _let_go(self, q: warm.Queue, name: str) -> None:
        """A search's worker with no trial in hand ends, given back, not lost (no restart, its queue
        not given up): one that served trials reads its release and exits (its job COMPLETED); one
        that never took a trial, perhaps still pending, is cancelled."""
        q.ended.add(name)
        if name in q.claims().values():
            protocol.release(q.dir, name)
        else:
            q.workers[name].cancel(check=False)

    def env(self, shape: Shape) -> dict[str, str]:
        """What every job's trainer is told beyond its config: CPU ranks' BLAS threads, how often it may
        requeue itself, and what an mpiexec inside the allocation needs (on one node: its ranks on
        loopback)."""
        env = {requeue.MAX_REQUEUES: str(self.launcher.max_requeues)}
        if not shape.gpus_per_task:  # CPU ranks: a BLAS thread per CPU of the task, not per CPU of the node
            env.update(blas_threads(self.launcher.cpus_per_task))
        if not self.bootstrap.on(shape.nodes).srun:
            env.update(parallel.mpiexec_settings(one_host=shape.nodes == 1))
        return env

    def _submit(
        self, shape: Shape, n_points: int, calls: list[tuple], at_once: int, points: list[list[str]]
    ) -> list[Job]:
        """One job array of ``calls`` (function, arguments), each allocation timed for ``n_points``,
        ``at_once`` of them running at a time; ``points``: each call's points, for its comment."""
        from submitit.core.utils import FailedJobError

        from sweeper.runners.slurm_job import submit_array  # submitit is heavy: once there is something to submit

        try:
            jobs = submit_array(self.folder / "%j", self.parameters(shape, n_points, at_once), calls, points)
        except FailedJobError as e:  # sbatch's own words; the sweep stops, its jobs cancelled (Sweep.stopped)
            said = " ".join(str(e).split())[:500]
            raise ConfigError(
                f"sbatch refused the job array of {shape.describe()}: {said}; check launcher.sbatch_args and "
                "launcher.setup (--dry-run prints the script)"
            ) from None
        self.watch.add(jobs)
        return jobs

    def pending(self) -> dict[str, int]:
        return self.watch.pending()

    def live(self, job_ids: list[str]) -> set[str]:
        return self.watch.live(job_ids)

    def allocated(self) -> str:
        return self.watch.allocated()

    def accounting(self, job_ids: list[str]) -> dict[str, str]:
        return partition.accounting(job_ids)

    def cancel_pending(self, job_name: str) -> list[str]:
        return partition.cancel_pending(job_name)

    def release(self, job: Job) -> None:
        pass  # Slurm holds the resources

    def cancel(self, job: Job) -> None:
        """scancel: Slurm sends SIGTERM to every task (a warm point's Ticket cancels its worker's allocation)."""
        job.cancel(check=False)

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.stopping = True
            for job in self.pool.live_jobs():
                job.cancel(check=False)
