"""Slurm stopping a job to run it again: a requeue, a preemption, a time limit.

A requeue or preemption (``scontrol requeue``, PreemptMode=REQUEUE) sends SIGTERM: the run ends
KILLED as on scancel, and :func:`by_slurm` tells the job's processes that the same job will run
again, so that they leave no result behind and it resumes from its checkpoint.

The warning before a time limit (submitit's ``#SBATCH --signal=USR2@90``) is SIGUSR2. It only
raises a flag: the ranks finish the epoch they are in (its checkpoint is written,
trainer/record/checkpoint.py), agree that one of them was warned, and stop together. The run then ends
KILLED and the process exits with :data:`REQUEUE_STATUS`, which tells the job's wrapper
(sweeper/job/point_job.py) to requeue the job, which resumes from the checkpoint into the same run;
after ``launcher.max_requeues`` restarts it ends FAILED instead, saying how far it got.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

from trainer.ranks import parallel

# A run's exit statuses beyond 0 and 1 (FAILED), which the warm worker and the job's wrapper read:
REQUEUE_STATUS = 75  # EX_TEMPFAIL: stopped at a checkpoint, to be started again
KILLED_STATUS = 143  # 128 + SIGTERM: the run ended KILLED; a warm worker stops serving points
MAX_REQUEUES = "SWEEPSCALE_MAX_REQUEUES"  # set in the job's environment by the Slurm runner

_warned = False


class TimeLimitReached(BaseException):
    """Every rank raises it at the same epoch's end (a BaseException: no ``except Exception`` keeps training)."""

    def __init__(self, epoch: int, epochs: int) -> None:
        self.epoch, self.epochs = epoch, epochs
        left = requeues_left()
        if left > 0:
            text = f"time limit after epoch {epoch} of {epochs}: requeued to resume ({left} requeue(s) left)"
        else:
            text = f"time limit after epoch {epoch} of {epochs}; raise launcher.timeout_min or resume"
        super().__init__(text)
        self.requeue = left > 0


def arm() -> None:
    """Take SIGUSR2 as the warning (its default action would kill the process at once)."""
    signal.signal(signal.SIGUSR2, _warn)


def _warn(_signum: int, _frame: Any) -> None:
    global _warned
    _warned = True


def warned(comm: Any) -> bool:
    """Whether any rank was warned (collective: every rank calls it at the same point). Asleep while
    it waits (parallel.agree): a rank that a SIGTERM ends before it comes here leaves its peers
    waiting, and they must still run their own SIGTERM's handler (a warm worker's ranks between
    points; at an epoch's end, rank 1 ending while rank 0 still recorded the epoch)."""
    return bool(parallel.agree(comm, int(_warned), "max"))


def requeues_left() -> int:
    """``launcher.max_requeues`` minus the restarts this job has had (Slurm counts every requeue)."""
    allowed = int(os.environ.get(MAX_REQUEUES, "0"))
    return allowed - int(os.environ.get("SLURM_RESTART_COUNT", "0"))


def job_fields() -> dict[str, str]:
    """This Slurm job as ``scontrol show job`` has it now (``Restarts``, ``StartTime`` ...); empty
    outside a job or when Slurm does not answer."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return {}
    try:
        out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    for line in out.splitlines():  # one line per task when ``job`` is also its array's id: this task's
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("JobId") == job:
            return fields
    return {}


def by_slurm() -> bool:
    """Whether Slurm is requeueing this job (``scontrol requeue``, preemption): its restart count is
    past the one this run of the job started with."""
    restarts = job_fields().get("Restarts", "0")
    return restarts.isdigit() and int(restarts) > int(os.environ.get("SLURM_RESTART_COUNT", "0"))
