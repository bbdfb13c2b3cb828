"""How a job's end reads (sweeper/job/job_end.py): a cancel is told from a failure by its first line, as
the closing table and the worker pool read it."""

from __future__ import annotations

from types import SimpleNamespace

from sweeper.job import job_end

# What a cold point's job raised, as submitit reports it: the job body's error is its trace's last line.
SUBMITIT_TRACE = (
    "Job (task=0) failed during processing with trace:\n----------------------\n"
    'Traceback (most recent call last):\n  File "/x/submitit/core/submission.py", line 55, in process_job\n'
    "sweeper.job.point_job.PointCancelledError: CANCELLED: trainer exited with status 143 (config c) on SIGTERM\n"
    "----------------------\nYou can check full logs with 'job.stderr(0)' and 'job.stdout(0)'"
)
# A worker whose step srun ended because its other task failed: the step's CANCELLED is a log line.
STEP_ENDED = (
    "gave up after 0 worker restart(s); the last: FAILED: worker w1 was ended with its job step (queue q):"
    " another task of the step failed\n  srun: error: vm: task 1: Exited with exit code 1\n"
    "  slurmstepd-vm: error: *** STEP 1742.0 ON vm CANCELLED AT 2026-11-27T01:34:43 ***"
)


def test_a_cancel_is_read_from_the_first_line_of_a_jobs_end():
    assert job_end.cancelled(SUBMITIT_TRACE)
    assert job_end.cancelled("CANCELLED: the worker's job was cancelled before this point ran (scancel)")
    assert not job_end.cancelled(STEP_ENDED)  # a failure whose log says its step was cancelled
    assert not job_end.cancelled(None)


def test_a_process_end_names_the_signal_its_status_carries():
    """#47: a rank killed by SIGKILL read "worker w1 exited with status 9"."""
    from sweeper.job.point_job import ended

    assert ended(9) == "exited with status 9 (mpiexec's, when a rank was killed by SIGKILL: the OOM killer, or kill -9)"
    assert ended(137) == "exited with status 137 (128 + 9: a process it ran was killed by SIGKILL)"
    assert ended(-11) == "was killed by SIGSEGV"
    assert ended(1) == ended(2).replace("2", "1") == "exited with status 1"


def test_a_job_that_ended_well_around_a_failed_point_is_not_called_finished():
    class Job:  # what submitit's local job says of a worker whose point failed: its process ended well
        state, paths = "FINISHED", None

        def exception(self):
            return RuntimeError("worker w1 exited with status 9 (queue q)")

    assert job_end.describe(Job()) == "worker w1 exited with status 9 (queue q)"


def test_a_job_that_left_no_result_leads_with_the_cause_from_its_log(tmp_path):
    """#50: a failure's text began with submitit's "FAILED: Job N (task: 0) with path ..._result.pkl"."""
    log = tmp_path / "7_0_log.err"
    log.write_text("srun: error: node1: task 0: Out Of Memory\nsome noise\n")

    class Job:  # what submitit's Slurm job says of a job killed before it wrote its result
        state, job_id, paths = "OUT_OF_MEMORY", "7", SimpleNamespace(stderr=log)

        def exception(self):
            return RuntimeError(f"Job 7 (task: 0) with path {tmp_path}/7_0_result.pkl\nhas not produced any output")

    said = job_end.describe(Job())
    assert said.splitlines()[0] == "srun: error: node1: task 0: Out Of Memory", said
    assert said.splitlines()[-1] == "(OUT_OF_MEMORY: job 7 left no result)"
    assert "result.pkl" not in said


def test_a_warm_point_whose_run_ended_on_sigterm_reads_cancelled(tmp_path):
    """A scancel'd warm point whose KILLED had not reached the store when the sweep closed its runs
    was ended FAILED: its worker's result (status 143) read as a failure."""
    from sweeper.runners.warm import Ticket
    from trainer.lifecycle import queue_files
    from trainer.lifecycle.requeue import KILLED_STATUS

    worker = SimpleNamespace(job_id="2280", paths=None)
    queue_files.write_result(tmp_path, KILLED_STATUS, "w1@vm:1409", 1.6)
    killed = Ticket(SimpleNamespace(dir=tmp_path), worker, "w1").exception()
    assert (
        job_end.cancelled(killed)
        and job_end.one_line(killed) == "CANCELLED: point ended on SIGTERM in worker w1@vm:1409"
    )
    queue_files.write_result(tmp_path, 2, "w1@vm:1409", 1.6)
    failed = Ticket(SimpleNamespace(dir=tmp_path), worker, "w1").exception()
    assert not job_end.cancelled(failed) and "point ended with status 2" in str(failed)
