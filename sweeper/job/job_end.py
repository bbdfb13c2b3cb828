"""What a job's end says, for the closing table and the run: its error in one line, and the cause's
lines from the stderr of each of its tasks (an MPI that could not start, a setup line that failed,
srun's own refusal), where submitit's report would bury them under its traceback."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# Lines that say what went wrong; the rest of a log is context.
ERRORISH = re.compile(
    r"error|failed|fail:|cannot|can not|could not|not built|unable|abort|killed|denied|refused|no such|invalid|"
    r"exception|exited with",
    re.IGNORECASE,
)
SUBMITIT_REPORT = "submitit ERROR"  # submitit's own report follows the job's last words


NO_RESULT = "has not produced any output"  # submitit's words for a job that ended without its result


def one_line(error: BaseException | str | None) -> str:
    """A job's exception in one line: submitit's "failed during processing" wraps the job body's
    traceback, whose last line is the error itself."""
    text = str(error or "").strip()
    if "failed during processing with trace" in text:
        trace = text.split("-" * 22)[1] if text.count("-" * 22) >= 2 else text
        lines = [line for line in trace.strip().splitlines() if line.strip()]
        text = lines[-1] if lines else text
    first = text.splitlines()[0] if text else ""
    for ours in ("sweeper.job.point_job.PointFailedError: ", "sweeper.job.point_job.PointCancelledError: "):
        first = first.removeprefix(ours)  # the job body's own words need no class path
    return first


def cancelled(error: BaseException | str | None) -> bool:
    """Whether a job's end says it was cancelled (scancel, Ctrl-C, a time limit), in its first line:
    the cause's log lines below it may say "STEP ... CANCELLED" where srun ended a step whose other
    task had failed, which is a failure."""
    return "CANCELLED" in one_line(error)


def task_logs(stderr: str | Path | None) -> list[Path]:
    """The stderr of every task of the job whose task 0 wrote ``stderr`` (submitit's
    ``<job>_<task>_log.err``, one per srun task), task 0 first."""
    if not stderr:
        return []
    first = Path(stderr)
    if first.is_symlink():  # a point's stderr.log leads to its job's
        first = first.resolve()
    if not first.name.endswith("_0_log.err"):
        return [first] if first.exists() else []
    stem = first.name[: -len("_0_log.err")]
    others = sorted(first.parent.glob(f"{stem}_*_log.err"), key=lambda p: p.name)
    return [first, *[p for p in others if p != first]] if first.exists() else others


def cause(stderr: str | Path | None, n: int = 4) -> str:
    """The lines of the job's task logs that say why it failed: the first and the last lines that
    read as errors (else the last lines), each once, before submitit's own report."""
    lines: list[str] = []
    for path in task_logs(stderr):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.split(SUBMITIT_REPORT)[0].splitlines():
            line = line.strip()
            if line and not _noise(line) and line not in lines:
                lines.append(line)
    errors = [line for line in lines if ERRORISH.search(line)]
    if not errors:
        return "\n".join(lines[-n:])
    chosen = [errors[0], *[e for e in errors[-(n - 1) :] if e != errors[0]]]
    return "\n".join(chosen)


def _noise(line: str) -> bool:
    """A traceback's frames and source lines, a banner's rules: no cause in them."""
    return (
        line.startswith(('File "', "Traceback (most recent call last)", "^", "~"))
        or not any(c.isalnum() for c in line)
        or line.startswith(("raise ", "return "))
    )


def describe(job: Any) -> str:
    """Why a job ended, in a few lines: the scheduler's state, the error, and the cause from its logs."""
    state = str(getattr(job, "state", "") or "")
    raised = job.exception()
    error = one_line(raised)
    if error and state in ("FINISHED", "COMPLETED"):  # the job's process ended well, its point did not
        state = ""
    paths = getattr(job, "paths", None)
    why = cause(paths.stderr) if paths is not None else ""
    if NO_RESULT in str(raised or ""):  # submitit's "Job N (task: 0) with path ..." names no cause: the log's first
        said = f"{state or 'ended'}: job {getattr(job, 'job_id', '?')} left no result"
        return f"{why}\n({said})" if why else said
    head = f"{state}: {error}" if state and state not in error else error
    return "\n".join(part for part in (head or "it exited", why) if part)
