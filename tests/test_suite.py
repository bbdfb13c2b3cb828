"""The suite's own machinery: what `make test` relies on to run its tests side by side."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT

GROUPED = textwrap.dedent(
    """
    import os, pytest, time

    def _where(group):
        time.sleep(0.2)  # long enough that an idle second worker would take one
        with open(os.environ["WHERE"], "a") as f:
            f.write(f"{group} {os.environ['PYTEST_XDIST_WORKER']}\\n")

    @pytest.mark.xdist_group("study")
    @pytest.mark.parametrize("i", range(4))
    def test_marked_in_its_file(i):
        _where("study")

    @pytest.mark.slurm
    @pytest.mark.parametrize("i", range(4))
    def test_grouped_by_the_suites_conftest(i):
        _where("services")
    """
)


def test_tests_of_one_xdist_group_run_in_one_worker(tmp_path: Path) -> None:
    """scripts/test.sh runs two workers with --dist loadgroup: the Slurm and PostgreSQL tests (one
    cluster, one database; tests/conftest.py groups them) and the tests of one module fixture must
    share a worker. pytest 9.2's node ids made xdist drop the groups without a word (pytest-xdist#1386),
    and a group added after xdist's worker read the marks was dropped too: each test ran where it fell."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    where = tmp_path / "where"
    # The suite's own conftest as a plugin, so its hooks run as they do in `make test`
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p", "no:cacheprovider"]
    cmd += ["-p", "tests.conftest", "test_grouped.py"]
    env = {"WHERE": str(where), "PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, list[str]] = {}
    for line in where.read_text().splitlines():
        group, worker = line.split()
        workers.setdefault(group, []).append(worker)
    for group in ("study", "services"):
        assert len(workers[group]) == 4 and len(set(workers[group])) == 1, (group, workers[group])
