"""A point that an earlier sweep's Slurm job still trains (that sweep's sweeper is gone): the new
sweep watches its run to its end, as one of its own jobs, instead of training the point again."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

from sweeper.job.point_job import PointFailedError

POLL_S = 2.0  # the run's status, and squeue if it is still RUNNING: gently, it trains for a while


class EarlierJob:
    """The Job protocol (sweeper/runners/base.py) for run ``run_id`` in Slurm job ``job_id``."""

    paths = None  # its logs are the earlier sweep's

    def __init__(self, client: Any, run_id: str, job_id: str, live: Callable[[list[str]], set[str]]) -> None:
        self.client, self.run_id, self.job_id, self.live = client, run_id, job_id, live
        self.status, self.asked_at, self.gone = "RUNNING", 0.0, False

    def done(self) -> bool:
        if self.status == "RUNNING" and time.monotonic() - self.asked_at >= POLL_S:
            self.asked_at = time.monotonic()
            self.status = self.client.get_run(self.run_id).info.status
            # A job that ended without ending its run (killed hard): its run waits for nothing.
            self.gone = self.status == "RUNNING" and not self.live([self.job_id])
        return self.status != "RUNNING" or self.gone

    def exception(self) -> BaseException | None:
        if self.gone:
            return PointFailedError(f"job {self.job_id} of an earlier sweep ended and left its run RUNNING")
        if self.status == "FINISHED":
            return None
        return PointFailedError(f"its run ended {self.status} in job {self.job_id} of an earlier sweep")

    def cancel(self, check: bool = True) -> None:
        """This sweep interrupted: the job it watches ends too (its trainer ends the run KILLED)."""
        subprocess.run(["scancel", self.job_id], capture_output=True, check=check)
