"""MPICH's shared-memory segments of a Slurm job step, removed so that a requeued job can start.

MPICH names a node's segments after the PMI job id, ``/dev/shm/mpich_{shm,vci}_<FNV-1a of
"JOB.STEP">_<node>``, and unlinks them in MPI_Finalize: ranks that abort or are killed leave
them behind. A requeued job runs the same job and step ids again, so its ranks would attach to
the dead step's segment and fail in MPI_Init ("Message ... truncated"). The job's wrapper
(sweeper/point_job.py) removes them after its rank ended (no rank of the step opens them again)
and, in a restarted job, before its rank starts: only segments older than this run of the job,
so a sibling task's fresh one is kept. Standard library only, like the wrapper.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from trainer.lifecycle import requeue

SHM = Path("/dev/shm")


def world_id(job: str, step: str) -> str:
    """MPICH's world id for a PMI job id ``JOB.STEP``: its 32-bit FNV-1a hash, in hex."""
    h = 2166136261
    for byte in f"{job}.{step}".encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return f"{h:x}"


def segments() -> list[Path]:
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if not (job and step):
        return []
    wid = world_id(job, step)
    return [*SHM.glob(f"mpich_shm_{wid}_*"), *SHM.glob(f"mpich_vci_{wid}_*")]


def remove(older_than: float | None = None) -> None:
    """Unlink this step's segments (those last written before ``older_than``, a time.time())."""
    for path in segments():
        try:
            if older_than is None or path.stat().st_mtime < older_than:
                path.unlink()
        except OSError:  # another task removed it first, or it is not ours
            pass


def remove_stale() -> None:
    """In a restarted job: the segments its earlier run left, before any rank of this one starts."""
    if int(os.environ.get("SLURM_RESTART_COUNT", "0")) == 0 or not segments():
        return
    start = requeue.job_fields().get("StartTime")
    if start and start[0].isdigit():  # no answer from Slurm: MPI_Init will say what went wrong
        remove(older_than=datetime.fromisoformat(start).timestamp())  # Slurm prints local time
