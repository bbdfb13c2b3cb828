"""submitit's local jobs as the local runner starts them (sweeper/runners/local_jobs.py): real
controllers and tasks."""

from __future__ import annotations

import time

from submitit.core import utils

from sweeper.runners.local_jobs import LocalExecutor


def test_a_job_starts_when_its_folder_comes_late_from_a_busy_sweeper(tmp_path, monkeypatch):
    """submitit makes a job's folder (named by its controller's pid) only after the controller has
    started; a sweeper slower than the controller (a busy machine) left it opening its logs in no
    folder, and no task ran. The folder is made in the controller's process before it starts."""
    move = utils.JobPaths.move_temporary_file

    def late(self, *args, **kwargs):  # the sweeper, descheduled between starting the controller and this
        time.sleep(2)
        return move(self, *args, **kwargs)

    monkeypatch.setattr(utils.JobPaths, "move_temporary_file", late)
    executor = LocalExecutor(folder=str(tmp_path / "%j"))
    executor.update_parameters(timeout_min=2)
    job = executor.submit(pow, 2, 10)
    assert job.result() == 1024
    assert job.paths.stdout.exists() and job.paths.folder == tmp_path / job.job_id
