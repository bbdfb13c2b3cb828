"""What a point's job, or a warm worker's, runs (each Slurm task runs it too). Standard library
only (and trainer/lifecycle/requeue.py): every job imports this module to unpickle its function, so it
must start fast.

A job that Slurm requeues, or that asks to be requeued at a time limit (the trainer exits with
requeue.REQUEUE_STATUS after its checkpoint), leaves without a result: submitit and the sweep
then keep waiting for the same job, which runs this again and resumes from the checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

from sweeper.job import mpich_shm
from trainer.lifecycle import queue_files, requeue
from trainer.lifecycle.requeue import REQUEUE_STATUS

POINT_CONFIG = "point"


class PointFailedError(RuntimeError):
    """The trainer of a point exited with a non-zero status."""


class PointCancelledError(PointFailedError):
    """The trainer (or worker) ended on SIGTERM: scancel, the sweep's Ctrl-C, a time limit."""


# A warm worker that served its queue, some of whose points failed, fails its job (sacct FAILED, as
# a cold job of a failed point); the sweep starts no worker in its place.
SOME_FAILED = "served its points; some failed:"


TERMINATED = (143, -15)  # 128 + SIGTERM as the trainer returns it; -15 when the signal ended it


def run_point(config_dir: str, env: dict[str, str], launch: list[str] | None = None) -> int:
    """A cold point's job body (every Slurm task runs it): start the trainer, pass signals on.
    ``launch``: the command that starts the ranks (mpiexec inside a Slurm allocation), if any."""
    cmd = [sys.executable, "-m", "trainer", "--config-dir", config_dir, "--config-name", POINT_CONFIG]
    return _run([*(launch or []), *cmd], env, "trainer", f"config {config_dir}/{POINT_CONFIG}.yaml")


def run_worker(
    queue: str, name: str, nproc: int, mpiexec: str | None, env: dict[str, str], launch: list[str] | None = None
) -> int:
    """A warm worker's job body (every Slurm task runs it): serve the queue's points (trainer/worker.py)."""
    cmd = [sys.executable, "-m", "trainer.worker", queue, "--name", name, "--nproc", str(nproc)]
    if mpiexec:
        cmd += ["--mpiexec", mpiexec]
    _run([*(launch or []), *cmd], env, f"worker {name}", f"queue {queue}")
    if failed := queue_files.failed_claims(Path(queue), name):
        raise PointFailedError(f"worker {name} {SOME_FAILED} {', '.join(failed)}")
    return 0


def _run(cmd: list[str], env: dict[str, str], who: str, where: str) -> int:
    # srun's PMI hands each task a socket (PMI_FD); the trainer, not this wrapper, is the rank.
    keep = (int(os.environ["PMI_FD"]),) if "PMI_FD" in os.environ else ()
    mpich_shm.remove_stale()
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, pass_fds=keep)

    def forward(signum: int, _frame: Any) -> None:
        proc.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(s, forward)
    status = proc.wait()
    mpich_shm.remove()  # left by ranks that did not finalize: the job may run again under the same ids
    if (status == REQUEUE_STATUS and "SLURM_JOB_ID" in os.environ) or (status in TERMINATED and requeue.by_slurm()):
        leave_for_requeue(ask=status == REQUEUE_STATUS)
    if status in TERMINATED and ended_with_its_step():
        raise PointFailedError(f"{who} was ended with its job step ({where}): another task of the step failed")
    if status in TERMINATED:
        raise PointCancelledError(f"CANCELLED: {who} exited with status {status} ({where}) on SIGTERM")
    if status:
        raise PointFailedError(f"{who} {ended(status)} ({where})")
    return 0


def ended(status: int) -> str:
    """How a process ended, its signal named where its status carries one: Python's -N, a shell's
    128 + N, or MPICH's mpiexec, which exits with the number of the signal that killed a rank."""
    number = -status if status < 0 else status - 128 if status > 128 else status
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"exited with status {status}"
    if status < 0:
        return f"was killed by {name}"
    if status > 128:
        return f"exited with status {status} (128 + {number}: a process it ran was killed by {name})"
    if number in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):  # statuses a program seldom picks
        who = ": the OOM killer, or kill -9" if number == signal.SIGKILL else ""
        return f"exited with status {status} (mpiexec's, when a rank was killed by {name}{who})"
    return f"exited with status {status}"


def ended_with_its_step() -> bool:
    """Whether this task's SIGTERM came from srun ending its step because another task failed
    (--kill-on-bad-exit: sweeper/runners/sbatch.py), not from a cancel: the job still runs."""
    if int(os.environ.get("SLURM_NTASKS", "1")) < 2 or "SLURM_STEP_ID" not in os.environ:
        return False
    return requeue.job_fields().get("JobState") == "RUNNING"


def leave_for_requeue(ask: bool) -> NoReturn:
    """End this task with no result for submitit; with ``ask``, task 0 first requeues the job, and
    the other tasks exit 0: srun's --kill-on-bad-exit would end the step on their status before
    task 0 had asked."""
    first = os.environ.get("SLURM_PROCID", "0") == "0"
    if ask and first:
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False, timeout=60)
    print(f"sweepscale: job {os.environ.get('SLURM_JOB_ID')} requeued: it resumes from its checkpoint", flush=True)
    sys.stderr.flush()
    os._exit(REQUEUE_STATUS if first or not ask else 0)  # past submitit's handlers: a result would end the job
