"""submitit's Slurm job as the sweep watches it: a job that Slurm is requeueing is not done."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import submitit

LISTED_POLL_S = 2.0  # squeue at most this often per job, while sacct says NODE_FAIL
RESULT_WAIT_S = 3  # submitit's default, 15 s, delays the news of every killed job (a shared FS's lag is less)
COMMENT_CHARS = 1000


class SlurmJob(submitit.SlurmJob):
    """A failed node (or one an administrator sets DOWN) requeues its jobs: sacct shows the run
    that ended as NODE_FAIL until slurmdbd records the job's next one, and submitit takes
    NODE_FAIL as final, so the sweep would give up a point whose job runs again and resumes it.
    While squeue still lists the job, it is not done."""

    _listed: tuple[float, bool] = (0.0, False)  # when squeue was asked, and whether it listed the job

    def done(self, force_check: bool = False) -> bool:
        if not super().done(force_check=force_check):
            return False
        if self.paths.result_pickle.exists() or self.state.upper() != "NODE_FAIL":
            return True
        asked_at, listed = self._listed
        if time.monotonic() - asked_at >= LISTED_POLL_S:
            listed = _in_squeue(self.job_id)
            self._listed = (time.monotonic(), listed)
        return not listed


def _in_squeue(job_id: str) -> bool:
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%T", "-j", job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False  # Slurm does not answer: sacct's word stands
    return bool(out.stdout.strip())


def submit_array(folder: Path, params: dict[str, Any], calls: list[tuple], points: list[list[str]]) -> list[SlurmJob]:
    """One job array of ``calls`` (function, arguments) with these executor parameters. Its comment
    (squeue's %k) says which points each task serves, ``0:hidden=16;1:hidden=32``, where
    ``points`` are the names of each call's points (a comment of sbatch_args wins)."""
    said = ";".join(f"{i}:{'+'.join(names)}" for i, names in enumerate(points))
    extra = {"comment": "".join(said.split())[:COMMENT_CHARS], **params.get("additional_parameters", {})}
    executor = submitit.SlurmExecutor(folder=str(folder))
    executor.update_parameters(**{**params, "additional_parameters": extra})
    with executor.batch():
        jobs = [executor.submit(fn, *args) for fn, *args in calls]
    for job in jobs:
        for task in [job, *job._sub_jobs]:
            # submitit makes array tasks of its own class, whatever the executor's job_class says
            task.__class__ = SlurmJob  # a job requeued after its node failed is watched on
            task._results_timeout_s = RESULT_WAIT_S  # submitit's wait for the result a killed job never writes
    return jobs
