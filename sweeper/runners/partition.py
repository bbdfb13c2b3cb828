"""What a Slurm partition offers, asked of Slurm itself (``scontrol show partition``, ``sinfo``):
the limits the pre-flight check holds every point to (:func:`check_limits`), so that a point the
partition can never run is refused instead of pending forever, and the ranks and GPUs per node a
launcher config that leaves them null gets; whether Slurm takes the account, qos and constraint
asked (``sbatch --test-only``); what sacct says of jobs."""

from __future__ import annotations

import functools
import math
import re
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sweeper.runners.base import SchedulerAwayError
from trainer.errors import ConfigError

ACCOUNTING_LAG_S = 5.0  # how long the closing table waits for sacct to know a job that just ended

if TYPE_CHECKING:
    from omegaconf import DictConfig


@dataclass(frozen=True)
class Partition:
    name: str
    max_time_min: float  # a job's longest time limit; math.inf when unlimited
    nodes: int  # the most nodes one job may span (its nodes, at most MaxNodes)
    cpus_per_node: int  # on its smallest node
    gpus_per_node: int  # on its smallest node (gres gpu:N)


def read(name: str | None) -> Partition:
    """Partition ``name`` (None: the cluster's default); ConfigError when Slurm cannot tell."""
    out = _ask(["scontrol", "-o", "show", "partition", *([name] if name else [])])
    rows = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.splitlines() if line.strip()]
    row = next(
        (r for r in rows if r.get("PartitionName") == name or (name is None and r.get("Default") == "YES")), None
    )
    if row is None:
        raise ConfigError(f"launcher.partition={name}: Slurm has no such partition (scontrol show partition)")
    nodes = int(row["TotalNodes"])
    if row.get("MaxNodes", "UNLIMITED") != "UNLIMITED":
        nodes = min(nodes, int(row["MaxNodes"]))
    cpus, gpus = [], []
    for line in _ask(["sinfo", "-h", "-p", row["PartitionName"], "-o", "%c|%G"]).splitlines():
        if "|" in line:
            c, gres = line.split("|", 1)
            cpus.append(int(c.rstrip("+")))
            gpus.append(gpu_count(gres))
    return Partition(row["PartitionName"], minutes(row["MaxTime"]), nodes, min(cpus, default=0), min(gpus, default=0))


def minutes(text: str) -> float:
    """A Slurm time ("UNLIMITED", "30", "1:00:00", "2-12:00:00") in minutes."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return math.inf
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        h, m, s = [*parts, 0, 0][:3]
    else:  # minutes, minutes:seconds, or hours:minutes:seconds
        h, m, s = {1: (0, parts[0], 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    return int(days or 0) * 1440 + h * 60 + m + s / 60


def gpu_count(gres: str) -> int:
    """GPUs in a node's gres ("gpu:4", "gpu:a100:4(S:0-1)", "(null)")."""
    total = 0
    for item in gres.split(","):
        if item.startswith("gpu:"):
            count = item.split("(")[0].rsplit(":", 1)[-1]
            total += int(count) if count.isdigit() else 0
    return total


def _ask(cmd: list[str]) -> str:
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise away(f"`{' '.join(cmd)}`: {e}") from None
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip()
        if not answers():  # installed, but no controller (or no munge) behind the commands
            raise away(f"`{' '.join(cmd)}`: {said.splitlines()[-1] if said else result.returncode}")
        raise ConfigError(f"launcher=slurm: `{' '.join(cmd)}` says: {said}")
    return result.stdout


@functools.cache
def answers() -> bool:
    """Whether a Slurm controller answers here (``scontrol ping``; asked once a process)."""
    try:
        return subprocess.run(["scontrol", "ping"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def away(why: str) -> SchedulerAwayError:
    return SchedulerAwayError(
        f"launcher=slurm: Slurm does not answer here ({why}); run the sweep where Slurm answers (a login node)"
    )


def check_limits(launcher: DictConfig, part: Partition, per_node: tuple[int, int, int], per_job: int) -> None:
    """ConfigError naming the key and the partition's limit that a job of this sweep would exceed."""
    ranks, gpus, nodes = per_node
    where = f"partition {part.name}"
    minutes = launcher.timeout_min * per_job
    problems = [
        (
            ranks * launcher.cpus_per_task > part.cpus_per_node,
            f"launcher.ranks_per_node={ranks} x cpus_per_task={launcher.cpus_per_task} CPUs, but {where}'s nodes "
            f"have {part.cpus_per_node}; lower them (null takes the partition's)",
        ),
        (
            gpus > part.gpus_per_node,
            f"launcher.gpus_per_node={gpus}, but {where}'s nodes have {part.gpus_per_node}; null takes the partition's",
        ),
        (nodes > part.nodes, f"launcher.max_nodes={nodes}, but {where} lets a job span {part.nodes} node(s)"),
        (
            minutes > part.max_time_min,
            f"launcher.timeout_min={launcher.timeout_min} x {per_job} point(s) per job = {minutes} min, but "
            f"{where}'s MaxTime is {part.max_time_min:g} min; lower launcher.timeout_min or launcher.points_per_job",
        ),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(message)


def check_request(launcher: DictConfig) -> None:
    """The account, qos and constraint asked of Slurm as it would take them: ``sbatch --test-only``
    submits nothing and answers what a real submission would meet (an unknown account, a qos the
    user may not use, a feature no node has). ConfigError naming the keys and Slurm's words."""
    asked = {key: launcher[key] for key in ("account", "qos", "constraint") if launcher[key] is not None}
    if not asked:
        return
    for kind in ("account", "qos"):  # a cluster that does not enforce accounting takes any name: ask it
        if kind in asked and _unknown(kind, asked[kind]):
            raise ConfigError(
                f"launcher.{kind}={asked[kind]}: Slurm's accounting has no {kind} {asked[kind]!r} "
                f"(`sacctmgr show {kind}`); fix the key or leave it null"
            )
    cmd = ["sbatch", "--test-only", "--nodes=1", "--ntasks=1", "--time=1", "--wrap=true"]
    cmd += [f"--{key}={value}" for key, value in asked.items()]
    if launcher.partition is not None:
        cmd.append(f"--partition={launcher.partition}")
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise away(f"`{' '.join(cmd)}`: {e}") from None
    if result.returncode != 0:
        keys = " ".join(f"launcher.{k}={v}" for k, v in asked.items())
        said = " ".join((result.stderr or result.stdout).split())
        raise ConfigError(f"{keys}: Slurm refuses it ({said}); fix the key or leave it null")


def accounting(job_ids: list[str], lag_s: float = ACCOUNTING_LAG_S) -> dict[str, str]:
    """sacct's state, elapsed time and nodes of each job (TIMEOUT, PREEMPTED, OUT_OF_MEMORY, NODE_FAIL, ...),
    waiting up to ``lag_s`` for a job slurmdbd has not recorded yet."""
    if not job_ids:
        return {}
    wanted = sorted(set(job_ids))
    cmd = ["sacct", "-n", "-P", "-X", "-o", "JobID,State,Elapsed,NodeList", "-j", ",".join(wanted)]
    deadline = time.monotonic() + lag_s
    while True:
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        rows = [line.split("|") for line in result.stdout.splitlines() if line.count("|") == 3]
        said = {job: f"{state.split()[0]} {elapsed} {nodes}".strip() for job, state, elapsed, nodes in rows}
        # slurmdbd records a job a moment after slurmctld ends it; no accounting at all fails at once
        if result.returncode != 0 or set(wanted) <= said.keys() or time.monotonic() > deadline:
            return said
        time.sleep(0.5)


def job_states(job_ids: list[str]) -> dict[str, str]:
    """What Slurm says of each job now, in one squeue call: "PENDING (BeginTime)", "RUNNING node1";
    a job squeue no longer lists, sacct's word (one call, no wait)."""
    if not job_ids:
        return {}
    cmd = ["squeue", "-h", "-r", "-j", ",".join(sorted(set(job_ids))), "-o", "%i|%T|%R"]  # -r: a line a task
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 2]
    said = {job: f"{state} {why}" for job, state, why in rows}  # %R: "(BeginTime)" pending, the nodes running
    return said | accounting([j for j in job_ids if j not in said], lag_s=0)


THROTTLE = re.compile(r"%\d+\]$")  # an array's tasks at once, as squeue writes it into the ids


def cancel_pending(job_name: str) -> list[str]:
    """Cancel this user's jobs still pending under the sweep's job name (``<name>:nproc=N``, set by
    sbatch.py): a dead sweeper's, whose points the sweep that closed it runs. The ids Slurm no
    longer lists as pending: array tasks by their array ids (``196_2``, ``196_[3-5]``), which
    scancel takes (a pending task's own job id, ``%A``, it may not)."""
    ids = sorted({job for job, name in _pending() if name.split(":", 1)[0] == job_name})
    if not ids:
        return []
    subprocess.run(["scancel", *ids], capture_output=True, timeout=30, check=False)
    left = {job for job, _name in _pending()}
    return [job for job in ids if job not in left]


def _pending() -> list[tuple[str, str]]:
    """(job or array id, job name) of this user's pending jobs; none where squeue does not answer."""
    cmd = ["squeue", "-h", "--me", "-t", "PENDING", "-o", "%i|%j"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = (line.split("|", 1) for line in out.splitlines() if "|" in line)
    return [(THROTTLE.sub("]", job), name) for job, name in rows]  # 1841_[0-1%2]: scancel takes 1841_[0-1]


def _unknown(kind: str, name: str) -> bool:
    """Whether Slurm's accounting answers and has no ``kind`` (account, qos) of this name."""
    try:
        cmd = ["sacctmgr", "-n", "-P", "show", kind, name, "format=name"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False  # no accounting here: sbatch --test-only is the only judge
    return result.returncode == 0 and name.lower() not in result.stdout.lower().split()
