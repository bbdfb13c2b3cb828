"""The package as a user installs it: a wheel built from the checkout, installed outside it, runs a sweep."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import NO_TIMING_FLOOR, ROOT
from trainer.record import store

PACKAGES = ("trainer", "sweeper", "hydra_plugins")
pytestmark = pytest.mark.xdist_group("wheel")  # one worker builds the wheel (each worker would build its own)


def run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd[:4])} ran past {timeout} s:\n{e.stdout}\n{e.stderr}", pytrace=False)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of the checkout's files (tracked or not ignored), built in a copy: a build in the
    checkout would leave build/ and egg-info there."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    listed = run(["git", "ls-files", "-co", "--exclude-standard", "-z"], ROOT).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((ROOT / name).read_bytes())
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src), "-w", str(out)]
    run(pip, src, timeout=600)
    (built,) = out.glob("sweepscale-*.whl")
    return built


def test_the_wheel_holds_every_package_of_the_checkout(wheel):
    """Packages are found by rule (pyproject.toml): each folder of Python files ships, data too."""
    names = zipfile.ZipFile(wheel).namelist()
    folders = {str(p.parent.relative_to(ROOT)) for top in PACKAGES for p in (ROOT / top).rglob("*.py")}
    shipped = {n.rsplit("/", 1)[0] for n in names if n.endswith(".py")}
    assert folders <= shipped, sorted(folders - shipped)
    assert "sweeper/report/page.html.j2" in names and "trainer/gpu/kernels.cu" in names
    assert any(n.startswith("trainer/embedded/") and n.endswith(".gz") for n in names)
    configs = {str(p.relative_to(ROOT)) for p in (ROOT / "conf").rglob("*.yaml")}
    assert configs <= set(names), sorted(configs - set(names))


@pytest.mark.mpi
def test_a_sweep_runs_from_the_installed_wheel_in_another_folder(wheel, tmp_path):
    """The wheel installed on its own (its dependencies are this environment's), the checkout nowhere
    on the path: every module comes from the install, and a 2-point sweep finishes there."""
    target, work = tmp_path / "site", tmp_path / "elsewhere"
    work.mkdir()
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)], tmp_path)
    env = {**os.environ, "PYTHONPATH": str(target), "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    env["SWEEPSCALE_CACHE"] = str(work / "cache")
    where = "import trainer.ranks.backend as a, sweeper.report.study as b, hydra_plugins.sweepscale_launcher as c; "
    where += "print(a.__file__, b.__file__, c.__file__)"
    files = run([sys.executable, "-c", where], work, env).stdout.split()
    assert all(f.startswith(str(target)) for f in files), files
    args = ["hidden=16,24", "epochs=1", "data.n_train=200", "data.n_test=50", "batch_size=50", *NO_TIMING_FLOOR]
    done = run([sys.executable, "-m", "sweeper", "-m", *args], work, env, timeout=300)
    assert "FINISHED" in done.stdout, done.stdout
    run([sys.executable, "-m", "trainer", "hidden=8", "epochs=1", "data.n_train=100", "data.n_test=20"], work, env)
    client = store.client(env["MLFLOW_TRACKING_URI"])
    (exp,) = [e for e in client.search_experiments() if e.name == "sweepscale"]
    statuses = sorted(r.info.status for r in client.search_runs([exp.experiment_id]))
    assert statuses == ["FINISHED"] * 4, statuses  # the parent, both points and the single run
