"""A full disk (#33 item 3, #47): the sweep ends in one line with none of its runs RUNNING (the
claim's reserve given back to close them), sync records what trained once space is back, and the
sweep run again trains nothing twice. A real small tmpfs as the sweep's working folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_sweeper import FAST, runs, sweep
from trainer import metrics


@pytest.fixture
def small_disk(tmp_path: Path):
    folder = tmp_path / "small"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=1460k", "tmpfs", str(folder)]
    if os.geteuid() != 0 or subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_a_full_disk_closes_every_run_and_sync_records_what_trained(small_disk):
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "SWEEPSCALE_CACHE")}  # all on it
    grid = ["hidden=16,32", *FAST]
    uri = f"sqlite:///{small_disk / 'mlflow.db'}"
    runs(uri)  # the empty store there: the disk fills while the sweep records (not ahead of it)
    full = sweep(grid, small_disk, env=env)
    assert full.returncode == 1, full.stdout + full.stderr
    assert "Error: the disk is full where the sweep writes" in full.stderr, full.stderr
    assert "its runs are closed, each saying what it lacks" in full.stderr, full.stderr
    assert "Traceback" not in full.stdout + full.stderr and "[SQL:" not in full.stdout, full.stdout + full.stderr
    found = runs(uri)
    assert "RUNNING" not in {r.info.status for r in found}, [(r.info.run_name, r.info.status) for r in found]
    (parent,) = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FAILED", parent.info.status
    assert "the disk was full" in parent.data.tags[metrics.TAG_ERROR], parent.data.tags[metrics.TAG_ERROR]
    folder = parent.data.tags[metrics.TAG_SWEEP_DIR]
    unsent = [r for r in found if r.info.status != "FINISHED" and r.info.run_id != parent.info.run_id]
    for r in unsent:  # each says what it lacks and how it gets it
        assert f"python -m sweeper.sync {folder}" in r.data.tags[metrics.TAG_ERROR], r.data.tags

    subprocess.run(["mount", "-o", "remount,size=32m", str(small_disk)], check=True)
    sync = [sys.executable, "-m", "sweeper.sync", folder]
    synced = subprocess.run(sync, cwd=small_disk, env=env, capture_output=True, text=True, timeout=120)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    kids = [r for r in runs(uri) if "mlflow.parentRunId" in r.data.tags]
    assert sorted((r.info.run_name, r.info.status) for r in kids) == [
        (n, "FINISHED") for n in ("hidden=16", "hidden=32")
    ]
    assert all(metrics.TAG_ERROR not in r.data.tags for r in kids), [r.data.tags for r in kids]
    assert all(r.data.metrics.get("test/precision") is not None for r in kids)  # what they trained is in

    again = sweep(grid, small_disk, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    found = runs(uri)
    assert "RUNNING" not in {r.info.status for r in found}
    kids = [r for r in found if "mlflow.parentRunId" in r.data.tags and r.info.status == "FINISHED"]
    assert sorted(r.info.run_name for r in kids) == ["hidden=16", "hidden=32"]  # each point trained once
