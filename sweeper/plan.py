"""From Hydra's expanded points to jobs: each point's trainer config and resource shape.

A point's ``nproc`` decides its job's shape: nproc MPI ranks, one GPU each on GPUs, spread
over ceil(nproc / ranks_per_node) nodes. Points of one shape are submitted as one job array.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from trainer.backend import gpu_count
from trainer.config import ConfigError, TrainerConfig, config_hash, validate

SWEEP_ONLY_KEYS = ("launcher", "sweep", "hydra")


@dataclass(frozen=True)
class Shape:
    nodes: int
    tasks_per_node: int
    gpus_per_task: int  # 1 on GPUs, 0 on CPUs

    def describe(self) -> str:
        unit = "GPU" if self.gpus_per_task else "CPU rank"
        return f"{self.nodes} node(s) x {self.tasks_per_node} task(s), 1 {unit} each"


@dataclass
class Point:
    index: int  # Hydra's job number
    overrides: list[str]  # this point's overrides, as Hydra made them
    trainer: DictConfig  # the resolved trainer config (struct, TrainerConfig)
    dir: Path  # Hydra's per-job folder in the sweep dir
    name: str = ""  # the child run's name: what sets this point apart, e.g. hidden=512,nproc=2
    shape: Shape | None = None
    config_hash: str = ""

    @property
    def nproc(self) -> int:
        return int(self.trainer.nproc)


def labels(job_overrides: list[list[str]]) -> list[str]:
    """Name each point by the overrides that vary across the sweep (all but sweep.* if none vary)."""
    own = [[o for o in ovs if not o.startswith("sweep.")] for ovs in job_overrides]
    varying = {o.split("=", 1)[0] for ovs in own for o in ovs if any(o not in other for other in own)}
    chosen = [[o for o in ovs if o.split("=", 1)[0] in varying] or ovs for ovs in own]
    return [",".join(c) or "defaults" for c in chosen]


def trainer_config(sweep_cfg: DictConfig) -> DictConfig:
    """The trainer's part of a composed sweep config, typed as TrainerConfig."""
    values = {k: v for k, v in OmegaConf.to_container(sweep_cfg, resolve=True).items() if k not in SWEEP_ONLY_KEYS}
    cfg = OmegaConf.merge(OmegaConf.structured(TrainerConfig), values)
    # Jobs run in other folders and on other nodes: paths must hold from anywhere.
    cfg.check.cache_dir = str(Path(cfg.check.cache_dir).expanduser().resolve())
    if cfg.data.dir is not None:
        cfg.data.dir = str(Path(cfg.data.dir).expanduser().resolve())
    OmegaConf.set_struct(cfg, True)
    return cfg


def local_shape(point: Point, launcher: DictConfig) -> Shape:
    """On this machine: GPUs when the point runs on GPUs, else CPU cores; never oversubscribed."""
    on_gpu = point.trainer.device.value != "cpu" and gpu_count() > 0
    if on_gpu:
        have = launcher.gpus if launcher.gpus is not None else gpu_count()
        what, fix = "GPUs", "lower nproc, or set launcher.gpus, or use launcher=slurm"
    else:
        have = launcher.cpus if launcher.cpus is not None else (os.cpu_count() or 1)
        what, fix = "CPU cores", "lower nproc, set launcher.cpus, or use launcher=slurm"
    if point.nproc > have:
        raise ConfigError(
            f"point {point.name}: nproc={point.nproc} needs {point.nproc} {what} but this machine has {have}; {fix}"
        )
    return Shape(1, point.nproc, int(on_gpu))


def slurm_shape(point: Point, launcher: DictConfig) -> Shape:
    per_node = launcher.gpus_per_node or launcher.ranks_per_node
    capacity = per_node * launcher.max_nodes
    if point.nproc > capacity:
        raise ConfigError(
            f"point {point.name}: nproc={point.nproc} exceeds {launcher.max_nodes} node(s) x {per_node} ranks "
            f"= {capacity}; raise launcher.max_nodes or launcher.ranks_per_node/gpus_per_node, or lower nproc"
        )
    nodes = math.ceil(point.nproc / per_node)
    if point.nproc % nodes:
        raise ConfigError(
            f"point {point.name}: nproc={point.nproc} cannot be spread evenly over {nodes} nodes of {per_node} "
            "ranks; use a multiple of the node count"
        )
    return Shape(nodes, point.nproc // nodes, int(launcher.gpus_per_node > 0))


def plan(points: list[Point], launcher: DictConfig) -> dict[Shape, list[Point]]:
    """Validate every point and group them by shape. Raises ConfigError before any submission."""
    if not points:
        raise ConfigError("the sweep is empty: no point to run; check the sweep's values (e.g. hidden=512,1024)")
    groups: dict[Shape, list[Point]] = {}
    for p in points:
        validate(p.trainer)
        if launcher.name == "debug" and p.nproc != 1:
            raise ConfigError(f"point {p.name}: launcher=debug runs in this process, so nproc must be 1")
        if launcher.name == "slurm":
            p.shape = slurm_shape(p, launcher)
        elif launcher.name == "local":
            p.shape = local_shape(p, launcher)
        else:  # debug: this process, one rank
            p.shape = Shape(1, 1, 0)
        p.config_hash = config_hash(p.trainer)
        groups.setdefault(p.shape, []).append(p)
    return groups
