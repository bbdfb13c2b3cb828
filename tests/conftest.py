"""Shared fixtures: composed configs, small real IDX data sets, a temporary MLflow store."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.browser import chromium_path, playwright_available
from trainer import data, idx
from trainer.ranks.backend import BLAS_THREADS

ROOT = Path(__file__).resolve().parents[1]
# The timing protocol's floor off, for the tiny runs of tests about other things: their training's
# batches past the warm-up are timed, and no extra steps after it (tests/test_trainer_runs.py and
# tests/test_timing.py test the floor itself).
NO_TIMING_FLOOR = ["perf.min_batches=1", "perf.min_seconds=0"]
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
# xdist's workers (execnet) set COLUMNS=80 and LINES=24, which every sweep a test starts would take
# for a terminal's width: the tests read the closing table as a pipe gets it (tests/test_display.py
# sets COLUMNS where it tests the width itself). Unset below Python too: outside xdist the C
# environment pytest runs in holds COLUMNS=80 that os.environ never saw, and children inherit it.
for _key in ("COLUMNS", "LINES"):
    os.environ.pop(_key, None)
    os.unsetenv(_key)
# One BLAS thread for each process the tests start, as the sweep's runners give their ranks: the
# suite runs two tests at once on two cores, and a standalone run's idle BLAS threads spin on
# cores the other test needs (tests/test_trainer_runs.py unsets them where it tests the default).
for _key in BLAS_THREADS:
    os.environ.setdefault(_key, "1")


def sweeper_command(args: list[str], figures: bool = False, retime: bool = False) -> list[str]:
    """``python -m sweeper -m ARGS``, its report without figures unless ``figures`` and none of its
    points timed again alone unless ``retime`` (or ARGS say): a 2-point sweep's figures were 6.8 of
    its 17 CPU-s and its retiming a third of the rest, which most tests read nothing of
    (tests/test_report.py, tests/test_check.py and tests/test_retime.py test them)."""
    extra = [] if figures else ["report.figures=false"]
    if not retime and not any(a.startswith("sweep.retime=") for a in args):
        extra.append("sweep.retime=false")
    return [sys.executable, "-m", "sweeper", "-m", *args, *extra]


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


# First: xdist's worker reads the groups in this same hook (it suffixes each node id with its group)
# and, registered after this file, would otherwise run before the "services" group below is added.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs CuPy and a CUDA GPU: run `make test-gpu` on a GPU machine")
    skip_mpi = pytest.mark.skip(reason="needs mpiexec: install the project's `mpich` extra")
    has_gpu = gpu_available()
    no_browser = None
    if any("browser" in item.keywords for item in items):
        if chromium_path() is None:
            no_browser = "needs Debian's chromium: run `bash scripts/browser_up.sh` (as root)"
        elif not playwright_available():
            no_browser = "needs the playwright package: install the project's `dev` extra"
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "mpi" in item.keywords and MPIEXEC is None:
            item.add_marker(skip_mpi)
        if "browser" in item.keywords and no_browser:
            item.add_marker(pytest.mark.skip(reason=no_browser))
        if "slurm" in item.keywords or "postgres" in item.keywords:
            # `make test` runs tests side by side (xdist); these share the cluster's nodes or the database
            item.add_marker(pytest.mark.xdist_group("services"))


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The skipped tests counted by why, last before pytest's own closing line: what a newcomer's
    machine lacks, and the command that gives it."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: dict[str, int] = {}
    for report in skipped:
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    terminalreporter.write_sep("-", f"{len(skipped)} skipped, by why")
    for reason, n in sorted(reasons.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{n:4d}  {reason}")


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request: pytest.FixtureRequest):
    """The array module: every array test runs with NumPy and, on a GPU machine, with CuPy."""
    if request.param == "numpy":
        return np
    import cupy

    return cupy


def write_idx_set(folder: Path, n_train: int, n_test: int, gz: bool = True) -> Path:
    """Real handwritten digits (the embedded set) written as the four MNIST IDX files."""
    ds = data.load_embedded_digits()
    folder.mkdir(parents=True, exist_ok=True)
    ext = ".gz" if gz else ""
    side = data.SIDE
    idx.write_idx(folder / f"{data.FILES['train_images']}{ext}", ds.x_train[:n_train].reshape(-1, side, side))
    idx.write_idx(folder / f"{data.FILES['train_labels']}{ext}", ds.y_train[:n_train])
    idx.write_idx(folder / f"{data.FILES['test_images']}{ext}", ds.x_test[:n_test].reshape(-1, side, side))
    idx.write_idx(folder / f"{data.FILES['test_labels']}{ext}", ds.y_test[:n_test])
    return folder


@pytest.fixture
def idx_dir(tmp_path: Path) -> Path:
    return write_idx_set(tmp_path / "digits", n_train=60, n_test=30)


@pytest.fixture
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite MLflow store, also seen by child processes through the environment."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("SWEEPSCALE_CACHE", str(tmp_path / "cache"))
    return uri


def compose(overrides: list[str] | None = None):
    """The trainer's config exactly as `python -m trainer overrides` would build it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from trainer.config import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="trainer", overrides=overrides or [])


@pytest.fixture(autouse=True)
def timing_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's runs see only each other as running beside them (trainer/ranks/contention.py): tests
    side by side (xdist) are not each other's contention, nor wait for each other's exclusive timing."""
    folder = tmp_path / "timing"
    monkeypatch.setenv("SWEEPSCALE_TIMING_DIR", str(folder))
    return folder


def recorded_parent(uri: str, sweep_id: str, name: str, overrides: str) -> tuple[Any, str, str, dict[str, str]]:
    """A sweep's parent run as the sweeper records it, in a real store, for a study built by hand:
    (the store's client, the experiment's id, the parent's id, the tags its children carry too)."""
    from trainer import metrics
    from trainer.record import store

    client = store.client(uri)
    exp = store.ensure_experiment(client, uri, "sweepscale")
    tags = {metrics.TAG_SWEEP_ID: sweep_id, metrics.TAG_SCHEDULER: "local"}
    parent = client.create_run(exp, run_name=name, tags=tags).info.run_id
    client.log_param(parent, "sweep.overrides", overrides)
    return client, exp, parent, tags


def group_commands(pgid: int) -> list[str]:
    """The command lines of the processes in one process group (a server started with setsid)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if entry.name.isdigit() and int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, ValueError):  # gone meanwhile, or not a process
            continue
    return found


def job_runner_commands(pgid: int) -> list[str]:
    """MLflow's job runner (``_job_runner`` and its ``huey_consumer``s) among a server's processes."""
    return [c for c in group_commands(pgid) if "huey" in c or "_job_runner" in c]
