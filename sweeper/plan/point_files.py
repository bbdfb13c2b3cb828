"""A point's folder (Hydra's per-job dir): the config its job runs, and links to the job's logs.

Every job runs the trainer's own CLI on the config written here:
``python -m trainer --config-dir <point dir> --config-name point`` (sweeper/job/point_job.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf, open_dict

from sweeper.job.point_job import POINT_CONFIG
from sweeper.points import Point
from trainer import metrics
from trainer.lifecycle.queue_files import POINT_DATA

if TYPE_CHECKING:
    from sweeper.runners.base import Job


def prepare(
    point: Point,
    uri: str,
    experiment: str,
    parent_id: str | None,
    sweep_id: str,
    checkpoints: bool,
    resume_from: str = "",
) -> None:
    """Fill in where the child run is recorded, under ``parent_id`` (None: the parent is told later,
    sweeper/track/ahead.py), and with ``checkpoints``, where its trainer keeps them: the point's folder,
    or ``resume_from``, an earlier sweep's point folder whose checkpoint it goes on from; and write
    the point's config for its job."""
    t = point.trainer
    with open_dict(t):
        if checkpoints:
            t.save.checkpoint_dir = resume_from or str(point.dir.resolve())
        t.mlflow.tracking_uri = uri
        t.mlflow.experiment = experiment
        t.mlflow.parent_run_id = parent_id
        t.mlflow.run_name = point.name
        t.mlflow.spool_dir = str(point.dir.resolve())  # used with a tracking server only
        t.mlflow.tags = {**t.mlflow.tags, metrics.TAG_SWEEP_ID: sweep_id}
    write_point_config(point)


def write_point_config(point: Point) -> Path:
    """A primary Hydra config holding the point's resolved trainer config (and its values as JSON)."""
    values = OmegaConf.to_container(point.trainer, resolve=True, enum_to_str=True)
    doc = {
        "defaults": ["trainer_schema", "_self_", {"override hydra/job_logging": "stdout"}],
        **values,
        "hydra": {"output_subdir": None, "run": {"dir": "."}},
    }
    point.dir.mkdir(parents=True, exist_ok=True)
    path = point.dir / f"{POINT_CONFIG}.yaml"
    OmegaConf.save(OmegaConf.create(doc), path)
    with open(point.dir / POINT_DATA, "w") as f:  # the same values for a warm worker, fast to load
        json.dump(values, f)
    return path


def link_logs(point: Point, job: Job) -> str:
    """Put the job's logs within reach of the point's folder; return the stderr path."""
    if job.paths is None:
        return ""
    for name, target in (("stdout.log", job.paths.stdout), ("stderr.log", job.paths.stderr)):
        link = point.dir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(target).resolve())
    return str(point.dir / "stderr.log")


def link_rank_logs(point: Point, log: str) -> None:
    """Every rank's log beside the point's (``stderr.rank1.log`` ...), where the job wrote one per
    task (srun: submitit's ``<job>_<task>_log.err``); locally mpiexec merges the ranks' in one."""
    if not log or not Path(log).is_symlink():
        return
    first = Path(log).resolve()
    for rank in range(1, point.nproc):
        for out, name in (("err", "stderr"), ("out", "stdout")):
            target = first.with_name(first.name.replace("_0_log.err", f"_{rank}_log.{out}"))
            link = point.dir / f"{name}.rank{rank}.log"
            if target != first and target.exists() and not link.is_symlink():
                link.symlink_to(target)
