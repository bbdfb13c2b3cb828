"""A full disk (#33 item 3): the sweep ends in one line, and the next sweep closes what it left
RUNNING with the true cause. A real small tmpfs as the sweep's working folder."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.test_sweeper import FAST, runs, sweep
from trainer import metrics


@pytest.fixture
def small_disk(tmp_path: Path):
    folder = tmp_path / "small"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(folder)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_a_full_disk_ends_the_sweep_in_a_line_and_the_next_closes_it_with_the_cause(small_disk):
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "SWEEPSCALE_CACHE")}  # all on it
    grid = ["hidden=16,32", *FAST]
    runs(
        f"sqlite:///{small_disk / 'mlflow.db'}"
    )  # a store there: the disk fills while the sweep records (not ahead of it)
    full = sweep(grid, small_disk, env=env)
    assert full.returncode == 1, full.stdout + full.stderr
    assert "Error: the disk is full where the sweep writes" in full.stderr, full.stderr
    assert "Traceback" not in full.stdout + full.stderr, full.stderr
    subprocess.run(["mount", "-o", "remount,size=32m", str(small_disk)], check=True)
    again = sweep(grid, small_disk, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    found = runs(f"sqlite:///{small_disk / 'mlflow.db'}")
    assert "RUNNING" not in {r.info.status for r in found}
    first = min((r for r in found if "mlflow.parentRunId" not in r.data.tags), key=lambda r: r.info.start_time)
    assert first.info.status == "KILLED", first.info.status
    assert "the disk was full" in first.data.tags[metrics.TAG_ERROR], first.data.tags[metrics.TAG_ERROR]
    kids = [r for r in found if "mlflow.parentRunId" in r.data.tags and r.info.status == "FINISHED"]
    assert sorted(r.info.run_name for r in kids) == ["hidden=16", "hidden=32"]  # each point finished once
