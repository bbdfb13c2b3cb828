"""Which code made a run: the git commit of the checkout the trainer runs from, and the package version.

Every trainer run is tagged with :func:`code_tags` (trainer/run.py start_recording). The git
commit goes under MLflow's own key, ``mlflow.source.git.commit``, which its UI shows on the run's
page. Outside a git checkout (an installed wheel, a copied tree) the git tags are left out.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from importlib import metadata
from pathlib import Path

from trainer import metrics

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # trainer/
DISTRIBUTION = "sweepscale"
GIT_TIMEOUT_S = 5


def _git(*args: str) -> str | None:
    """Output of a git command run in the package's folder, or None when it cannot answer."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=PACKAGE_DIR, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hangs
        return None
    return done.stdout if done.returncode == 0 else None


def git_state() -> tuple[str, bool] | None:
    """(commit, dirty) of the checkout this package's files belong to, or None when they are not in one.

    The package's own files must be tracked: an install into a virtualenv that lies inside some
    other repository is not that repository's code. Dirty: tracked files changed, or files that
    git neither tracks nor ignores (new sources the commit lacks)."""
    commit = _git("rev-parse", "HEAD")
    if not commit or _git("ls-files", "--error-unmatch", "__init__.py") is None:
        return None
    status = _git("status", "--porcelain")
    if status is None:
        return None
    return commit.strip(), bool(status.strip())


def package_version() -> str:
    """The installed distribution's version, else the one pyproject.toml beside the package says."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        text = (PACKAGE_DIR.parent / "pyproject.toml").read_text()
    except OSError:
        return "unknown"
    found = re.search(r'^\[project\][^\[]*?^version\s*=\s*"([^"]+)"', text, re.MULTILINE | re.DOTALL)
    return found.group(1) if found else "unknown"


def code_tags() -> dict[str, str]:
    """MLflow tags naming the code: the package version, and where it is a git checkout its commit
    (``mlflow.source.git.commit``) and whether the work tree differs from it (``sweepscale.git_dirty``).
    Asked once per process (three git commands): a warm worker's points ran the code it loaded."""
    return dict(_code_tags())


@functools.cache
def _code_tags() -> dict[str, str]:
    tags = {metrics.TAG_VERSION: package_version()}
    state = git_state()
    if state is not None:
        commit, dirty = state
        tags[metrics.TAG_GIT_COMMIT] = commit
        tags[metrics.TAG_GIT_DIRTY] = str(dirty).lower()
    return tags


def job_tags() -> dict[str, str]:
    """Which scheduler job ran this: Slurm's job id, and the array and its index (so that a point's
    run leads to its job, and ``sacct -j`` to what Slurm says of it)."""
    env = os.environ
    tags = {}
    if "SLURM_JOB_ID" in env:
        tags[metrics.TAG_SLURM_JOB] = env["SLURM_JOB_ID"]
    if "SLURM_ARRAY_JOB_ID" in env:
        tags[metrics.TAG_SLURM_ARRAY] = f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '')}"
    return tags
