"""MPICH's shared-memory segments of a Slurm job step, removed so that a job reusing its ids can start.

MPICH names a node's segments after the PMI job id, ``/dev/shm/mpich_{shm,vci}_<FNV-1a of
"JOB.STEP">_<node>``, and unlinks them in MPI_Finalize: ranks that abort or are killed leave
them behind. A job that runs under the same job and step ids again attaches to the dead step's
segment and fails in MPI_Init ("Message ... truncated") or hangs there: a requeued job, and any
job of a Slurm whose job ids started over (a test cluster set up again, on a machine whose
/dev/shm outlived the last one). The job's wrapper (sweeper/job/point_job.py) removes them after its
rank ended (no rank of the step opens them again) and before its rank starts: then only segments
older than this run of the job, so a sibling task's fresh one is kept. Standard library only,
like the wrapper.
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
    """The segments an earlier job of these ids left (this job's earlier run, or a job of a Slurm
    whose ids started over), before any rank of this one starts. Slurm is asked only where one is there."""
    if not segments():
        return
    start = requeue.job_fields().get("StartTime")
    if start and start[0].isdigit():  # no answer from Slurm: MPI_Init will say what went wrong
        remove(older_than=datetime.fromisoformat(start).timestamp())  # Slurm prints local time


def remove_jobs(jobs: list[str], steps: int = 10) -> int:
    """Every segment the steps 0..``steps``-1 of ``jobs`` left (a cluster's, once none of its jobs
    runs: scripts/slurm_down.sh); how many were removed."""
    dead = {
        f"mpich_{kind}_{world_id(job, str(step))}" for job in jobs for step in range(steps) for kind in ("shm", "vci")
    }
    removed = 0
    for path in SHM.glob("mpich_*"):
        if path.name.rsplit("_", 1)[0] in dead:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


if __name__ == "__main__":  # python -m sweeper.job.mpich_shm JOB_ID ...
    import sys

    print(f"removed {remove_jobs(sys.argv[1:])} MPICH segment(s) of {len(sys.argv) - 1} job(s)")
