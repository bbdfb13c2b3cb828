"""The suite's own machinery: what `make test` relies on to run its tests side by side."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

GROUPED = textwrap.dedent(
    """
    import os, pytest, time

    @pytest.mark.xdist_group("services")
    @pytest.mark.parametrize("i", range(4))
    def test_grouped(i):
        time.sleep(0.2)  # long enough that an idle second worker would take one
        with open(os.environ["WHERE"], "a") as f:
            f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    """
)


def test_tests_of_one_xdist_group_run_in_one_worker(tmp_path: Path) -> None:
    """scripts/test.sh runs two workers with --dist loadgroup: the Slurm and PostgreSQL tests (one
    cluster, one database) and the tests of one module fixture must share a worker. pytest 9.2's node
    ids made xdist drop the groups without a word (pytest-xdist#1386): each test ran where it fell."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    where = tmp_path / "where"
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p", "no:cacheprovider"]
    env = {"WHERE": str(where), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([*cmd, "test_grouped.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    workers = where.read_text().split()
    assert len(workers) == 4 and len(set(workers)) == 1, workers
