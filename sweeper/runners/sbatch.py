"""The sbatch script of one job array, as submitit writes it: the parameters the executor is given
(`slurm_parameters`) and their rendering for the preview (`sbatch_preview`);
tests/data/sbatch_preview.txt is its golden file."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from sweeper.points import Shape
    from sweeper.runners.bootstrap import Bootstrap

# What submitit runs in each task (its pickled function, our run_point), with this Python, as its
# SlurmExecutor writes it: the preview shows the very line submitted.
SUBMIT_COMMAND = f"{shlex.quote(sys.executable)} -u -m submitit.core._submit"
# submitit's own #SBATCH settings: logs appended, its wckey (and --signal, from signal_delay_s).
SUBMITIT_FIXED = {"open-mode": "append", "wckey": "submitit"}
# The requeue signal's lead before the time limit: submitit's 90 s, a quarter of shorter limits (at
# 90 s a 2-minute job was signalled 30 s in, before its worker had a handler: the task died, no requeue).
SIGNAL_LEAD_S, SIGNAL_LEAD_SHARE = 90, 4

# Parameters that are not #SBATCH options.
NOT_SBATCH = ("array_parallelism", "srun_args", "setup", "additional_parameters", "use_srun", "signal_delay_s")


def signal_lead_s(time_min: int) -> int:
    """Seconds before a job's time limit that Slurm sends USR2 (the trainer checkpoints, the job requeues)."""
    return min(SIGNAL_LEAD_S, time_min * 60 // SIGNAL_LEAD_SHARE)


def share(total: int, sizes: list[int]) -> list[int]:
    """``launcher.array_parallelism`` caps the whole sweep: split ``total`` jobs at once among job
    arrays of these sizes, in proportion, each at least one (more arrays than ``total`` exceed it)
    and none more than its size."""
    given = [1] * len(sizes)
    while sum(given) < total and any(g < s for g, s in zip(given, sizes)):
        i = max((i for i, s in enumerate(sizes) if given[i] < s), key=lambda i: sizes[i] / given[i])
        given[i] += 1
    return given


def slurm_parameters(
    launcher: DictConfig,
    shape: Shape,
    job_name: str,
    n_points: int = 1,
    at_once: int | None = None,
    bootstrap: Bootstrap | None = None,
) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for one shape's job array (also what the preview renders);
    each job serves at most ``n_points`` points, and its time limit covers them; ``at_once`` of
    them run at a time (the array's share of ``launcher.array_parallelism``). ``bootstrap``: srun's
    PMI plugin (each task a rank), or mpiexec (the job's one process starts the ranks, no srun)."""
    params: dict[str, Any] = {
        "job_name": f"{job_name}:nproc={shape.nodes * shape.tasks_per_node}",  # squeue tells the shapes apart
        "nodes": shape.nodes,
        "ntasks_per_node": shape.tasks_per_node,
        "cpus_per_task": launcher.cpus_per_task,
        "time": launcher.timeout_min * n_points,
        "signal_delay_s": signal_lead_s(launcher.timeout_min * n_points),
        "array_parallelism": at_once or launcher.array_parallelism,
        "srun_args": [*(srun_own(bootstrap.mode) if bootstrap and bootstrap.srun else []), *launcher.srun_args],
        "setup": [guarded(line) for line in launcher.setup],
        "additional_parameters": dict(launcher.sbatch_args),
    }
    if bootstrap is not None and not bootstrap.srun:
        params["use_srun"] = False
    if shape.gpus_per_task:
        params["gpus_per_node"] = shape.tasks_per_node
    if shape.exclusive:
        params["exclusive"] = True  # #SBATCH --exclusive: the nodes' other jobs would share their timing
    for key in ("partition", "account", "qos", "mem", "constraint"):
        if launcher[key] is not None:
            params[key] = launcher[key]
    return params


def srun_own(mode: str) -> list[str]:
    """srun's flags for the ranks it starts: their PMI plugin, and the step ended when a task fails
    (a rank that dies before MPI is up, its siblings waiting in MPI_Init, held the job until its
    time limit). A requeue's other tasks exit 0 for it (sweeper/job/point_job.py)."""
    return [f"--mpi={mode}", "--kill-on-bad-exit=1"]


SETUP_FAILED = "the setup line failed"  # in a job's log: any restart of it would fail alike


def guarded(line: str) -> str:
    """A setup line that ends the job when it fails (sbatch scripts go on past a failing line, and
    the point would then run without, say, its module)."""
    message = shlex.quote(f"sweepscale: {SETUP_FAILED}: {line} (launcher.setup)")
    return f"{line} || {{ echo {message} >&2; exit 1; }}"


def sbatch_preview(params: dict[str, Any], folder: Path, n_points: int) -> str:
    """The #SBATCH lines, setup lines and srun line of one job array of ``n_points`` jobs, as
    submitit writes them for these parameters (``folder`` holds ``%j``, as the executor's does)."""
    flags = {k: v for k, v in params.items() if k not in NOT_SBATCH and v is not None}
    flags.update(SUBMITIT_FIXED, signal=f"USR2@{params['signal_delay_s']}")
    flags["array"] = f"0-{n_points - 1}%{min(n_points, params['array_parallelism'])}"
    # Array tasks log to <array id>_<task index>; task 0 speaks for the #SBATCH lines.
    logs = str(Path(folder).expanduser().absolute()).replace("%j", "%A_%a")
    stdout, stderr = f"{logs}/%A_%a_%t_log.out", f"{logs}/%A_%a_%t_log.err"
    flags["output"], flags["error"] = stdout.replace("%t", "0"), stderr.replace("%t", "0")
    flags.update(params["additional_parameters"])
    lines = [sbatch_flag(key, flags[key]) for key in sorted(flags)]
    lines += params["setup"]
    if not params.get("use_srun", True):  # one process on the allocation's first node: it runs mpiexec
        lines.append(SUBMIT_COMMAND)
        return "\n".join(lines)
    srun = ["srun", "--unbuffered", "--output", stdout, "--error", stderr, *params["srun_args"]]
    lines.append(f"{shlex.join(srun)} {SUBMIT_COMMAND}")
    return "\n".join(lines)


def sbatch_flag(key: str, value: Any) -> str:
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"
