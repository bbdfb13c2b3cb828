"""A sweep's points and their resource shapes: plain data, shared by the planner, the runners
and the watch loop. Imports nothing of the sweeper (nor of the trainer)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

POINTS_ARTIFACT = "points.json"  # the parent run's list of its points: the sweep writes it, the report reads it
TIMED_ALONE = " (timed alone)"  # the end of the run name of a point timed again alone (sweeper/track/retime.py)


@dataclass(frozen=True)
class Shape:
    """What one point's job asks for; points of one shape share a job array on Slurm."""

    nodes: int
    tasks_per_node: int
    gpus_per_task: int  # 1 on GPUs, 0 on CPUs
    exclusive: bool = False  # Slurm: whole nodes (perf.timing=exclusive: no other job's batches beside)
    shared_cores: int = 0  # more CPU ranks than cores: the cores they share (0: a core each)

    def describe(self) -> str:
        unit = "GPU" if self.gpus_per_task else "CPU rank"
        alone = ", whole nodes" if self.exclusive else ""
        if self.shared_cores:
            return f"{self.nodes} node(s) x {self.tasks_per_node} task(s) sharing {self.shared_cores} CPU core(s)"
        return f"{self.nodes} node(s) x {self.tasks_per_node} task(s), 1 {unit} each{alone}"


@dataclass
class Point:
    index: int  # Hydra's job number
    overrides: list[str]  # this point's overrides, as Hydra made them
    trainer: DictConfig  # the resolved trainer config (struct, TrainerConfig)
    dir: Path  # Hydra's per-job folder in the sweep dir
    name: str = ""  # the child run's name: what sets this point apart, e.g. hidden=512,nproc=2
    shape: Shape | None = None  # set by the plan, from the runner's rule
    cannot: str = ""  # in a preview: why this machine cannot run it (too few cores or GPUs)
    config_hash: str = ""

    @property
    def nproc(self) -> int:
        return int(self.trainer.nproc)


# Overrides that say how and where a sweep runs, never what a point computes: no part of its name.
NOT_NAMES = ("sweep.", "launcher", "hydra", "mlflow.", "mpi.", "paths.")


def labels(job_overrides: list[list[str]]) -> list[str]:
    """Name each point by the trainer overrides that vary across the sweep (all of them if none vary)."""
    own = [[o for o in ovs if not o.lstrip("+~").startswith(NOT_NAMES)] for ovs in job_overrides]
    varying = {o.split("=", 1)[0] for ovs in own for o in ovs if any(o not in other for other in own)}
    chosen = [[o for o in ovs if o.split("=", 1)[0] in varying] or ovs for ovs in own]
    return [",".join(c) or "defaults" for c in chosen]
