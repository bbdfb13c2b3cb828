"""Points as local submitit jobs on this machine; each job's trainer starts its ranks with mpiexec.

Jobs start while GPUs (or CPU cores) are free: points never share a GPU, cores are never
oversubscribed, and a point that does not fit waits for a release.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from sweeper.point_job import run_point
from sweeper.points import Point, Shape
from trainer.backend import gpu_count
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from sweeper.runners.base import Job


class LocalRunner:
    scheduler: ClassVar[str] = "local"

    def __init__(self, launcher: DictConfig, folder: Path, job_name: str) -> None:
        self.launcher, self.folder = launcher, folder
        self.n_gpus = launcher.gpus if launcher.gpus is not None else gpu_count()
        self.n_cpus = launcher.cpus if launcher.cpus is not None else (os.cpu_count() or 1)
        self.free_gpus = list(range(self.n_gpus))
        self.free_cpus = self.n_cpus
        self.held: dict[int, list[int]] = {}
        self.executor = None

    def shape(self, point: Point) -> Shape:
        """GPUs when the point runs on GPUs, else CPU cores; never more than this machine has."""
        on_gpu = point.trainer.device.value != "cpu" and gpu_count() > 0
        if on_gpu:
            have, what, fix = self.n_gpus, "GPUs", "lower nproc, or set launcher.gpus, or use launcher=slurm"
        else:
            have, what, fix = self.n_cpus, "CPU cores", "lower nproc, set launcher.cpus, or use launcher=slurm"
        if point.nproc > have:
            raise ConfigError(
                f"point {point.name}: nproc={point.nproc} needs {point.nproc} {what} but this machine has {have}; {fix}"
            )
        return Shape(1, point.nproc, int(on_gpu))

    def check(self, points: list[Point]) -> None:
        pass  # the shapes already hold every point to this machine's GPUs and cores

    def preview(self, groups: dict[Shape, list[Point]]) -> dict[str, str]:
        return {}  # the table of points and resources says it all

    def start(self, queued: list[Point]) -> list[tuple[Point, Job]]:
        if self.executor is None:
            import submitit  # heavy: only once there is something to start

            self.executor = submitit.LocalExecutor(folder=str(self.folder / "%j"))
            self.executor.update_parameters(timeout_min=self.launcher.timeout_min)
        started = []
        for p in list(queued):  # in order; a point that does not fit now waits for a release
            if not self._fits(p):
                continue
            env = {}
            if p.shape.gpus_per_task:
                ids, self.free_gpus = self.free_gpus[: p.nproc], self.free_gpus[p.nproc :]
                self.held[p.index] = ids
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
            else:
                self.free_cpus -= p.nproc
            queued.remove(p)
            started.append((p, self.executor.submit(run_point, str(p.dir), env)))
        return started

    def release(self, point: Point) -> None:
        if point.shape.gpus_per_task:
            self.free_gpus = sorted(self.free_gpus + self.held.pop(point.index, []))
        else:
            self.free_cpus += point.nproc

    def cancel(self, job: Job) -> None:
        """SIGTERM to the job's process (a local job's id is its pid), which passes it to the
        trainer and its ranks: they end their run KILLED and exit."""
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(job.job_id), signal.SIGTERM)

    def _fits(self, p: Point) -> bool:
        return p.nproc <= (len(self.free_gpus) if p.shape.gpus_per_task else self.free_cpus)
