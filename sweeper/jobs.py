"""Submitting points: what a job runs, and the three launchers (local, slurm, debug).

Every job runs the trainer's own CLI on a config file written into the point's folder:
``python -m trainer --config-dir <point dir> --config-name point``. Locally that process starts
its ranks with mpiexec; on Slurm every task runs it and becomes one MPI rank through srun's PMI.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sweeper.plan import Point, Shape
from sweeper.point_job import POINT_CONFIG, PointFailedError, run_point
from trainer.backend import gpu_count
from trainer.config import ConfigError


def write_point_config(point: Point) -> Path:
    """A primary Hydra config holding the point's resolved trainer config."""
    values = OmegaConf.to_container(point.trainer, resolve=True, enum_to_str=True)
    doc = {
        "defaults": ["trainer_schema", "_self_", {"override hydra/job_logging": "stdout"}],
        **values,
        "hydra": {"output_subdir": None, "run": {"dir": "."}},
    }
    point.dir.mkdir(parents=True, exist_ok=True)
    path = point.dir / f"{POINT_CONFIG}.yaml"
    OmegaConf.save(OmegaConf.create(doc), path)
    return path


class FinishedInProcess:
    """The debug launcher's stand-in for a submitit job that already ran."""

    job_id = "in-process"
    paths = None
    state = "DONE"

    def __init__(self, error: BaseException | None) -> None:
        self._error = error

    def done(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return self._error

    def cancel(self, check: bool = True) -> None:
        pass


class DebugRunner:
    """One point at a time, in this process (nproc=1), so breakpoints work."""

    def start(self, queued: list[Point]) -> list[tuple[Point, Any]]:
        from trainer.run import main as train

        point = queued.pop(0)
        status = train(point.trainer, [])
        error = None if status == 0 else PointFailedError(f"trainer returned status {status}")
        return [(point, FinishedInProcess(error))]

    def release(self, point: Point) -> None:
        pass

    def cancel(self, job: Any) -> None:
        pass  # the point ran to its end already


class LocalRunner:
    """Points as local submitit jobs, started while GPUs (or cores) are free, never oversubscribed."""

    def __init__(self, launcher: DictConfig, folder: Path) -> None:
        import submitit

        self.executor = submitit.LocalExecutor(folder=str(folder / "%j"))
        self.executor.update_parameters(timeout_min=launcher.timeout_min)
        n_gpus = launcher.gpus if launcher.gpus is not None else gpu_count()
        self.free_gpus = list(range(n_gpus))
        self.free_cpus = launcher.cpus if launcher.cpus is not None else (os.cpu_count() or 1)
        self.held: dict[int, list[int]] = {}

    def _fits(self, p: Point) -> bool:
        return p.nproc <= (len(self.free_gpus) if p.shape.gpus_per_task else self.free_cpus)

    def start(self, queued: list[Point]) -> list[tuple[Point, Any]]:
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

    def cancel(self, job: Any) -> None:
        """SIGTERM to the job's process (a local job's id is its pid), which passes it to the
        trainer and its ranks: they end their run KILLED and exit."""
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(job.job_id), signal.SIGTERM)

    def release(self, p: Point) -> None:
        if p.shape.gpus_per_task:
            self.free_gpus = sorted(self.free_gpus + self.held.pop(p.index, []))
        else:
            self.free_cpus += p.nproc


def slurm_parameters(launcher: DictConfig, shape: Shape, name: str) -> dict[str, Any]:
    params: dict[str, Any] = {
        "job_name": name,
        "nodes": shape.nodes,
        "ntasks_per_node": shape.tasks_per_node,
        "cpus_per_task": launcher.cpus_per_task,
        "time": launcher.time_min,
        "array_parallelism": launcher.array_parallelism,
        "srun_args": [f"--mpi={launcher.pmi}", *launcher.srun_args],
        "setup": list(launcher.setup),
        "additional_parameters": dict(launcher.sbatch_args),
    }
    if shape.gpus_per_task:
        params["gpus_per_node"] = shape.tasks_per_node
    for key in ("partition", "account", "qos", "mem", "constraint"):
        if launcher[key] is not None:
            params[key] = launcher[key]
    return params


def sbatch_preview(launcher: DictConfig, shape: Shape, folder: Path, n_points: int) -> str:
    """The #SBATCH lines submitit would write for one group's job array."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = slurm_parameters(launcher, shape, "sweepscale")
    text = _make_sbatch_string(
        command="python -u -m submitit.core._submit", folder=folder, map_count=n_points, **params
    )
    return "\n".join(line for line in text.splitlines() if line.startswith(("#SBATCH", "srun")) or "setup" in line)


def check_partition(launcher: DictConfig) -> None:
    """Ask the scheduler whether the partition exists; surface its own message if not."""
    if launcher.partition is None:
        return
    cmd = ["sbatch", "--test-only", f"--partition={launcher.partition}", "--wrap=true"]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except FileNotFoundError as e:
        raise ConfigError("launcher=slurm but sbatch is not installed here; run the sweep on a Slurm login node") from e
    if result.returncode != 0:
        msg = result.stderr.strip() or result.stdout.strip()
        raise ConfigError(f"launcher.partition={launcher.partition}: Slurm says: {msg}")


class SlurmRunner:
    """One submitit job array per shape, all submitted at once; Slurm does the queueing."""

    def __init__(self, launcher: DictConfig, folder: Path, groups: dict[Shape, list[Point]], sweep_id: str) -> None:
        import submitit

        self.launcher, self.folder, self.groups, self.sweep_id = launcher, folder, groups, sweep_id
        self.submitit = submitit

    def start(self, queued: list[Point]) -> list[tuple[Point, Any]]:
        started = []
        for shape, points in self.groups.items():
            todo = [p for p in points if p in queued]
            if not todo:
                continue
            executor = self.submitit.SlurmExecutor(folder=str(self.folder / "%j"))
            executor.update_parameters(**slurm_parameters(self.launcher, shape, f"sweepscale-{self.sweep_id}"))
            with executor.batch():
                jobs = [executor.submit(run_point, str(p.dir), {}) for p in todo]
            for p, job in zip(todo, jobs):
                queued.remove(p)
                started.append((p, job))
        return started

    def release(self, point: Point) -> None:
        pass

    def cancel(self, job: Any) -> None:
        job.cancel(check=False)  # scancel: Slurm sends SIGTERM to every task
