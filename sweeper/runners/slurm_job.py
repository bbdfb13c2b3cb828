"""submitit's Slurm job as the sweep watches it: a job that Slurm is requeueing is not done."""

from __future__ import annotations

import subprocess
import time

import submitit

LISTED_POLL_S = 2.0  # squeue at most this often per job, while sacct says NODE_FAIL


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
