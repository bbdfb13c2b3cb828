"""Slurm's word on a sweep's jobs while they run and after: what squeue says is pending and why,
the requeues it reports (NODE_FAIL, PREEMPTED, REQUEUED) with the cause sacct keeps for the run
of the job that ended, and what sacct says every run of every job was allocated (requeues
included). The Slurm runner (sweeper/runners/slurm.py) submits; this module watches."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sweeper.runners.base import Job

NOT_YET = "not yet scheduled"  # how the progress line names squeue's reason "None" for a pending job
PENDING_POLL_S = 5.0  # squeue, for the progress line's pending jobs: gently on a busy controller
CAUSE_POLLS = 3  # polls a requeue waits for sacct (slurmdbd lags) to name the run that ended, then is told without
CAUSES = {  # sacct's state of a job's run that Slurm ended to run the job again
    "NODE_FAIL": "NODE_FAIL (its node failed)",
    "PREEMPTED": "PREEMPTED",
    "REQUEUED": "REQUEUED (its time limit's warning, or scontrol requeue)",
}
NOT_OVER = ("PENDING", "RUNNING", "REQUEUE_HOLD", "REQUEUE_FED")  # sacct states of a run still to come or going on


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None  # Slurm does not answer: the last word stands


class JobsWatch:
    """The sweep's submitted jobs, as squeue and sacct see them. ``say`` prints a line the moment a
    job is seen requeued."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.submitted: list[str] = []  # the ids of jobs not seen ended yet, for squeue
        self.jobs: dict[str, Job] = {}
        self.pending_ids: set[str] = set()  # the jobs squeue last said were pending
        self._pending: tuple[float, dict[str, int]] = (0.0, {})  # when squeue was last asked, and its answer
        self._restarts: dict[str, int] = {}  # job -> the requeues already told
        self._causes: dict[tuple[str, int], str] = {}  # (job, restarts) -> the cause told
        self._unnamed: Counter[str] = Counter()  # polls the job's newest requeue has waited for its cause

    def add(self, jobs: list[Job]) -> None:
        self.submitted += [job.job_id for job in jobs]
        self.jobs.update({job.job_id: job for job in jobs})

    def pending(self) -> dict[str, int]:
        """The sweep's pending jobs by Slurm's reason ("requeued after NODE_FAIL ..." for one Slurm
        requeued), from squeue at most every PENDING_POLL_S. A job squeue no longer lists has ended:
        submitit is asked to look now (it polls sacct lazily, up to minutes apart, and a job killed
        before it wrote its result would be seen that late)."""
        asked_at, counts = self._pending
        if not self.submitted or time.monotonic() - asked_at < PENDING_POLL_S:
            return counts
        fields = "JobArrayID:|,State:|,RestartCnt:|,Reason:"  # -r: a line per array task, its id as sacct's
        out = _run(["squeue", "-h", "-r", "-O", fields, "-j", ",".join(self.submitted)])
        if out is None:
            return counts
        rows = [line.strip().split("|", 3) for line in out.splitlines() if line.count("|") >= 3]
        rows = [(job, state, int(n) if n.isdigit() else 0, why.strip()) for job, state, n, why in rows]
        for job, _state, restarts, _why in rows:
            self._tell_requeues(job, restarts)
        pending = [(job, restarts, why) for job, state, restarts, why in rows if state == "PENDING"]
        # a job the scheduler has not looked at yet says "None": it waits all the same
        counts = dict(Counter(self._reason(job, restarts, why) for job, restarts, why in pending))
        self.pending_ids = {job for job, _, _ in pending}
        listed = {row[0] for row in rows}
        for job_id in [j for j in self.submitted if j not in listed]:  # until sacct, which lags, says so too
            if self.jobs[job_id].done(force_check=True):
                self.submitted.remove(job_id)
        self._pending = (time.monotonic(), counts)
        return counts

    def _reason(self, job: str, restarts: int, why: str) -> str:
        if restarts and (job, restarts) in self._causes:
            return f"requeued after {self._causes[job, restarts]}"
        return NOT_YET if why == "None" else why

    def _tell_requeues(self, job: str, restarts: int) -> None:
        """The job's requeues not told yet, told in a line each with its cause (sacct's state of the
        run that ended), once sacct has them, or after CAUSE_POLLS polls without."""
        if restarts <= self._restarts.get(job, 0):
            return
        ended = run_states(job)
        self._unnamed[job] += 1
        if len(ended) < restarts and self._unnamed[job] < CAUSE_POLLS:
            return
        self._tell(
            job, [ended[r] if r < len(ended) else "" for r in range(restarts)], "; it resumes from its checkpoint"
        )

    def _tell(self, job: str, causes: list[str], then: str = "") -> None:
        for restart in range(self._restarts.get(job, 0) + 1, len(causes) + 1):
            cause = causes[restart - 1]
            said = CAUSES.get(cause, cause or "a cause sacct has not recorded yet")
            self._causes[job, restart] = said
            self.say(f"slurm job {job}: requeued after {said} (restart {restart}){then}")
        self._restarts[job] = max(len(causes), self._restarts.get(job, 0))
        self._unnamed[job] = 0

    def live(self, job_ids: list[str]) -> set[str]:
        """Which of these jobs squeue still lists (running or waiting)."""
        if not job_ids:
            return set()
        out = _run(["squeue", "-h", "-o", "%A", "-j", ",".join(sorted(set(job_ids)))])
        return set() if out is None else set(out.split()) & set(job_ids)

    def allocated(self) -> str:
        """What sacct says every run of the sweep's jobs was allocated, requeued runs included, in a
        line; empty where it says nothing."""
        held = allocations(list(self.jobs))
        for job, causes in held.requeues.items():  # those the live line missed (a job that ended within a poll)
            self._tell(job, causes)
        return held.said() if held.runs else ""


def run_states(job: str) -> list[str]:
    """sacct's states of the job's runs that ended, in order (a requeued job's: NODE_FAIL, PREEMPTED
    or REQUEUED, then its last run's); slurmdbd records each a moment after it ends."""
    out = _run(["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State", "-j", job])
    states = [line.split("|")[1].split()[0] for line in (out or "").splitlines() if line.count("|") == 1]
    return [s for s in states if s not in NOT_OVER]


@dataclass
class Allocations:
    runs: int = 0  # runs of the jobs (a requeued job's runs each count)
    cpu_s: float = 0.0  # CPUs allocated x the seconds each run lasted
    gpu_s: float = 0.0
    requeues: dict[str, list[str]] = field(default_factory=dict)  # job -> the states of its requeued runs

    @property
    def requeued(self) -> int:
        """The runs Slurm ended to run their job again."""
        return sum(len(states) for states in self.requeues.values())

    def said(self) -> str:
        again = f", {self.requeued} of them ended by a requeue" if self.requeued else ""
        gpus = f", {self.gpu_s:.1f} GPU-seconds" if self.gpu_s else ""
        return f"{self.runs} allocation(s){again}: {self.cpu_s:.1f} CPU-seconds{gpus} (sacct)"


def allocations(job_ids: list[str]) -> Allocations:
    """Every run of these jobs (sacct -D: a requeued job's earlier runs too), their CPUs and GPUs
    times the seconds each lasted, as the site's accounting bills them."""
    held = Allocations()
    if not job_ids:
        return held
    cmd = ["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State,ElapsedRaw,AllocTRES", "-j", ",".join(sorted(job_ids))]
    for line in (_run(cmd) or "").splitlines():
        if line.count("|") != 3:
            continue
        job, state, elapsed, tres = line.split("|")
        state = state.split()[0]  # "CANCELLED by 0"
        if not elapsed.isdigit() or state == "PENDING":
            continue
        alloc = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
        held.runs += 1
        if state in CAUSES:
            held.requeues.setdefault(job, []).append(state)
        held.cpu_s += int(elapsed) * _count(alloc.get("cpu", "0"))
        held.gpu_s += int(elapsed) * _count(alloc.get("gres/gpu", "0"))
    return held


def _count(value: str) -> float:
    """A TRES count as sacct writes it (``2``, or ``1K``-style for large ones)."""
    scale = {"K": 1e3, "M": 1e6}.get(value[-1:], 1)
    try:
        return float(value.rstrip("KM")) * scale
    except ValueError:
        return 0.0
