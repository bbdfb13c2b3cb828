"""A point's job requeued on the real Slurm: by an administrator (or preemption), then by itself at
its time limit, until launcher.max_requeues is spent. The sweep keeps watching the same job, and
the point's one MLflow run goes on from its checkpoints with nothing lost or logged twice."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeper.runners import partition
from tests.conftest import ROOT, sweeper_command
from tests.test_sweeper import FAST, SLURM, runs, slurm, sweep
from tests.test_warm import only_sweep
from trainer import metrics
from trainer.record import checkpoint, store

pytestmark = pytest.mark.mpi


def wait_for(what: str, condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def job_state(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def restarts(job: str) -> int:
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    found = [f.split("=", 1)[1] for f in shown.split() if f.startswith("Restarts=")]
    return int(found[0]) if found and found[0].isdigit() else 0


def start_now(job: str, since: int | None = None) -> None:
    """Slurm holds a requeued job for about two minutes (its BeginTime); the test lets it start
    sooner, but not within the second its old credential was revoked in ("Job credential revoked":
    slurmd refuses a credential of the same job that is not newer than the revocation). A job
    Slurm started again by itself meanwhile (a busy machine's slow polls miss its pending) is left be:
    ``since``, its restarts before the requeue (None: as now, for a requeue still to come)."""
    before = restarts(job) if since is None else since
    wait_for(
        f"job {job} pending again",
        lambda: job_state(job) == "PENDING" or (restarts(job) > before and job_state(job) == "RUNNING"),
    )
    if job_state(job) == "PENDING":
        time.sleep(2)
        subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True)


def child(uri: str):
    kids = [r for r in runs(uri) if "mlflow.parentRunId" in r.data.tags]
    return kids[0] if len(kids) == 1 else None


@slurm
def test_requeued_and_time_limited_jobs_resume_into_the_same_run(tmp_path, mlflow_uri):
    runs(mlflow_uri)  # create the store first: polling must not race the sweeper's schema set-up
    never_ends = ["hidden=16", "nproc=2", "epochs=100000", "batch_size=50", "data.n_train=200", "data.n_test=50"]
    cmd = sweeper_command([*never_ends, *SLURM, "launcher.max_requeues=2"])
    wide = {**os.environ, "COLUMNS": "250"}  # the closing table unfolded
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=wide)
    job = ""
    try:
        wait_for("a checkpoint", lambda: any(tmp_path.glob(f"multirun/*/*/0/{checkpoint.FILE}")))
        (link,) = tmp_path.glob("multirun/*/*/0/stderr.log")
        job = Path(os.readlink(link)).parent.name  # the array task serving the point: 12_0
        run_id = child(mlflow_uri).info.run_id

        def resumed(restarts: str) -> bool:
            run = child(mlflow_uri)
            return run.info.status == "RUNNING" and run.data.tags.get(metrics.TAG_RESTARTS) == restarts

        # 1. An administrator's requeue (preemption alike): SIGTERM now, the same job again later.
        subprocess.run(["scontrol", "requeue", job], check=True)
        start_now(job)
        wait_for("the run resumed after the requeue", lambda: resumed("1"))
        # 2. The time-limit warning with a requeue left: the job checkpoints and requeues itself.
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        start_now(job)
        wait_for("the run resumed after its own requeue", lambda: resumed("2"))
        # 3. The warning again, no requeue left: the run ends FAILED, saying how far it got.
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        out, _ = proc.communicate(timeout=120)
        wait_for("the worker's job to end after its failed point", lambda: not job_state(job))
    finally:
        proc.kill()  # a sweep that hangs must not outlive the test (nor its job)
        if job:
            subprocess.run(["scancel", job], capture_output=True, check=False)
    assert proc.returncode == 1, out
    run = child(mlflow_uri)
    assert run.info.run_id == run_id and run.info.status == "FAILED"  # one run throughout
    error = run.data.tags[metrics.TAG_ERROR]
    assert "; raise launcher.timeout_min or resume" in error and "time limit after epoch" in error, error
    epochs = int(error.split("time limit after epoch ")[1].split()[0])
    client_steps = sorted(m.step for m in _history(mlflow_uri, run_id, metrics.TRAIN_LOSS))
    assert client_steps == list(range(epochs * 4))  # 200 samples in batches of 50: nothing lost, nothing twice
    epoch_steps = sorted(m.step for m in _history(mlflow_uri, run_id, metrics.TRAIN_LOSS_EPOCH))
    assert epoch_steps == list(range(1, epochs + 1))
    assert {r.info.status for r in runs(mlflow_uri)} == {"FAILED"}  # the parent too; nothing RUNNING
    header = next(line for line in out.splitlines() if "restarts" in line).split("┃")
    row = next(line for line in out.splitlines() if line.startswith("│ hidden=16")).split("│")
    assert row[[h.strip() for h in header].index("restarts")].strip() == "2", out  # the closing table shows them
    said = " ".join(out.split())  # each requeue told with sacct's cause, and every allocation counted
    assert said.count(f"slurm job {job}: requeued after REQUEUED") == 2, out
    assert "allocated: 3 allocation(s), 2 of them ended by a requeue" in said, out
    assert partition.accounting([job])[job].startswith("FAILED")  # the job failed with its point, as sacct says


def _history(uri: str, run_id: str, key: str):
    return store.client(uri).get_metric_history(run_id, key)


@slurm
def test_the_segment_a_killed_step_leaves_is_the_one_the_wrapper_removes(tmp_path, monkeypatch):
    """Ranks that end without MPI_Finalize (aborted, killed) leave MPICH's segment in /dev/shm under
    a name made from the job and step ids, which a requeued job reuses (sweeper/job/mpich_shm.py)."""
    from sweeper.job import mpich_shm

    job, step, leaked = _leave_a_segment(tmp_path)
    assert leaked.exists()
    monkeypatch.setenv("SLURM_JOB_ID", job)
    monkeypatch.setenv("SLURM_STEP_ID", step)
    mpich_shm.remove(older_than=leaked.stat().st_mtime)  # as new as this run of the job: a sibling's, kept
    assert leaked.exists()
    mpich_shm.remove()
    assert not leaked.exists()


@slurm
def test_a_clusters_teardown_removes_the_segments_of_its_jobs_only(tmp_path):
    """scripts/slurm_down.sh gives /dev/shm back: what its jobs' killed steps left, nothing else."""
    from sweeper.job import mpich_shm

    job, step, leaked = _leave_a_segment(tmp_path)
    assert leaked.exists(), (job, step, sorted(p.name for p in mpich_shm.SHM.glob("mpich_*"))[-20:])
    other = mpich_shm.SHM / f"mpich_shm_{mpich_shm.world_id(job + '0', '0')}_0"  # not one of these jobs'
    other.write_bytes(b"")
    try:
        assert mpich_shm.remove_jobs([job]) >= 1, (job, step, leaked.exists())  # and any a dead cluster left
        assert not leaked.exists() and other.exists()
    finally:
        other.unlink(missing_ok=True)


def _leave_a_segment(tmp_path: Path) -> tuple[str, str, Path]:
    """A real step's job id, step id and the MPICH segment it left, as ranks killed before
    MPI_Finalize leave it."""
    from sweeper.job import mpich_shm

    script = tmp_path / "leave.py"
    script.write_text(
        "import os\nfrom sweeper.job import mpich_shm\nmpich_shm.remove_stale()\n"  # a dead cluster's, of these ids
        "from mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\n"
        "if MPI.COMM_WORLD.rank == 0: print(os.environ['SLURM_JOB_ID'], os.environ['SLURM_STEP_ID'], flush=True)\n"
        "MPI.COMM_WORLD.Barrier()\nos._exit(0)\n"
    )
    srun = ["srun", "-n2", "--mpi=pmi2", sys.executable, str(script)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    job, step = subprocess.run(srun, capture_output=True, text=True, timeout=60, check=True, env=env).stdout.split()
    return job, step, mpich_shm.SHM / f"mpich_shm_{mpich_shm.world_id(job, step)}_0"


@slurm
def test_a_job_whose_ids_an_earlier_cluster_used_starts_past_its_segment(tmp_path, mlflow_uri):
    """A Slurm set up again numbers its jobs from the start, while /dev/shm keeps what killed ranks
    of the last one left (CI's test cluster on a machine that ran it before). The next job ids are
    given such a segment: the job that gets one removes it before its ranks start (MPI_Init failed
    on it, or hung until the time limit)."""
    from sweeper.job import mpich_shm

    job, _step, leaked = _leave_a_segment(tmp_path)
    ids = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True).stdout.split()
    last = max(int(i) for i in [*ids, job] if i.isdigit())
    stale = {}
    for job in range(last + 1, last + 41):  # the next ids, whoever else submits meanwhile
        copy = mpich_shm.SHM / f"mpich_shm_{mpich_shm.world_id(str(job), '0')}_0"
        copy.write_bytes(leaked.read_bytes())
        os.utime(copy, (leaked.stat().st_mtime,) * 2)  # as old as a dead step's
        stale[str(job)] = copy
    leaked.unlink()
    try:
        result = sweep(["hidden=16", "nproc=2", "dtype=float64", *FAST, *SLURM], tmp_path, timeout=150)
    finally:
        for copy in stale.values():
            copy.unlink(missing_ok=True)
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = only_sweep(mlflow_uri).values()
    assert run.info.status == "FINISHED" and run.data.tags["sweepscale.world_size"] == "2"
    assert run.data.tags[metrics.TAG_SLURM_JOB] in stale, (run.data.tags[metrics.TAG_SLURM_JOB], sorted(stale))


@slurm
def test_a_live_job_of_a_killed_sweeper_is_not_submitted_twice(tmp_path, mlflow_uri):
    """The sweeper SIGKILLed, its Slurm job trains on: the same sweep again leaves that point to the
    job (no second run) and watches it to its end, withdraws the job's unclaimed points and runs
    them itself."""
    runs(mlflow_uri)  # create the store first: polling must not race the sweeper's schema set-up
    grid = ["epochs=1000,2", "hidden=8", "batch_size=50", "data.n_train=200", "data.n_test=50", *SLURM]
    cmd = sweeper_command(grid)
    first = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wait_for("the long point's run", lambda: child(mlflow_uri) is not None)
    long_run = child(mlflow_uri)
    job = long_run.data.tags[metrics.TAG_SLURM_JOB]
    first.kill()  # the sweeper alone: its job (one allocation for both points) goes on
    first.wait()
    try:
        again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"watch epochs=1000: run {long_run.info.run_id} goes on in job {job}" in again.stdout
        rows = [line for line in again.stdout.splitlines() if line.startswith("│ epochs=")]
        assert len(rows) == 2 and all("FINISHED" in row for row in rows), again.stdout  # waited for, not skipped
        wait_for(f"job {job} to end", lambda: not job_state(job), timeout=180)
    finally:
        subprocess.run(["scancel", job], capture_output=True, check=False)
    by_name: dict[str, list[str]] = {}
    for r in runs(mlflow_uri):
        by_name.setdefault(r.info.run_name.split(" · ")[0], []).append(r.info.status)  # parents: what they sweep
    assert by_name["epochs=1000"] == ["FINISHED"] and by_name["epochs=2"] == ["FINISHED"], by_name  # once each
    assert sorted(by_name["sweep epochs"]) == ["FINISHED", "KILLED"]  # the new parent, the orphan closed


@slurm
def test_a_sweep_run_again_resumes_a_time_limited_point_in_its_run(tmp_path, mlflow_uri):
    """#33 item 13: its requeues spent, a point's run ends FAILED at the time limit ("raise
    launcher.timeout_min or resume"); the same sweep again goes on from the point's checkpoint in
    that same run, to its end: every step logged once, the stop's error gone, the run the new
    sweep's, nothing left RUNNING."""
    runs(mlflow_uri)
    point = ["hidden=64", "nproc=1", "epochs=400", "batch_size=50", "data.n_train=200", "data.n_test=50"]
    cmd = sweeper_command([*point, *SLURM, "launcher.max_requeues=0"])
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    job = ""
    try:
        wait_for("a checkpoint", lambda: any(tmp_path.glob(f"multirun/*/*/0/{checkpoint.FILE}")))
        (link,) = tmp_path.glob("multirun/*/*/0/stderr.log")
        job = Path(os.readlink(link)).parent.name
        subprocess.run(["scancel", "--signal=USR2", job], check=True)  # the time-limit warning
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        if job:
            subprocess.run(["scancel", job], capture_output=True, check=False)
    assert proc.returncode == 1, out
    stopped = child(mlflow_uri)
    assert (
        stopped.info.status == "FAILED"
        and "raise launcher.timeout_min or resume" in stopped.data.tags[metrics.TAG_ERROR]
    )
    epoch = int(stopped.data.tags[metrics.TAG_ERROR].split("time limit after epoch ")[1].split()[0])
    assert 1 <= epoch < 400, "the run ended before the warning: make its epochs longer"

    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"goes on from its checkpoint of epoch {epoch}" in again.stdout, again.stdout
    run = child(mlflow_uri)
    assert run.info.run_id == stopped.info.run_id and run.info.status == "FINISHED"
    assert metrics.TAG_ERROR not in run.data.tags
    parents = [r for r in runs(mlflow_uri) if "mlflow.parentRunId" not in r.data.tags]
    newest = max(parents, key=lambda r: r.info.start_time)
    assert run.data.tags["mlflow.parentRunId"] == newest.info.run_id
    assert sorted(r.info.status for r in parents) == ["FAILED", "FINISHED"]
    steps = sorted(m.step for m in _history(mlflow_uri, run.info.run_id, metrics.TRAIN_LOSS))
    assert steps == list(range(400 * 4))  # 200 samples in batches of 50: nothing lost, nothing twice


def pending_jobs(job_name: str) -> list[str]:
    """Pending jobs by the ids scancel takes: an array's pending tasks as ``196_[0-1]``."""
    out = subprocess.run(["squeue", "-h", "--me", "-o", "%i|%j|%T"], capture_output=True, text=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 2]
    return sorted(job for job, name, state in rows if name.split(":")[0] == job_name and state == "PENDING")


@slurm
@pytest.mark.parametrize("warm", [True, False], ids=["one-allocation", "job-array"])
def test_a_killed_sweepers_pending_jobs_are_cancelled_by_the_next_sweep(warm, tmp_path, mlflow_uri):
    """#33 item 11: the sweeper SIGKILLed while its jobs still wait in Slurm's queue; the same sweep
    again cancels them (they would train its points a second time) and runs every point once. #50:
    cold points pend as array tasks, which scancel takes by their array ids (``N_[0-1]``) only."""
    runs(mlflow_uri)
    grid = ["hidden=8,16", "epochs=2", "batch_size=50", "data.n_train=200", "data.n_test=50", *SLURM]
    held = [*grid, f"launcher.warm={warm}", "+launcher.sbatch_args={begin: 'now+600'}"]  # its jobs pend (BeginTime)
    first = subprocess.Popen(
        sweeper_command(held),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    waiting: list[str] = []
    try:
        wait_for("the parent run", lambda: len(runs(mlflow_uri)) == 1)
        name = f"sweepscale-{runs(mlflow_uri)[0].data.tags[metrics.TAG_SWEEP_ID]}"
        wait_for("its jobs pending", lambda: bool(pending_jobs(name)))
        waiting = pending_jobs(name)
        if warm:
            shown = ["squeue", "-h", "-o", "%k", "-j", ",".join(waiting)]
            comments = subprocess.run(shown, capture_output=True, text=True)
            assert comments.stdout.split() == ["0:hidden=8+hidden=16"], comments  # one allocation, its points (item 15)
        else:
            assert len(waiting) == 1 and re.search(r"_\[0-1(%\d+)?\]$", waiting[0]), waiting  # its two tasks
            waiting = [re.sub(r"%\d+\]$", "]", waiting[0])]  # as the sweep names them: scancel's form
        first.kill()
        first.wait()
        again = subprocess.run(sweeper_command(grid), cwd=tmp_path, capture_output=True, text=True, timeout=240)
    finally:
        first.kill()
        for job in waiting:
            subprocess.run(["scancel", job], capture_output=True, check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"its pending jobs {', '.join(waiting)} cancelled" in again.stdout, again.stdout
    assert not pending_jobs(name) and all(not job_state(job) for job in waiting)
    by_name: dict[str, list[str]] = {}
    for r in runs(mlflow_uri):
        by_name.setdefault(r.info.run_name.split(" · ")[0], []).append(r.info.status)
    assert by_name["hidden=8"] == ["FINISHED"] and by_name["hidden=16"] == ["FINISHED"], by_name  # once each
    assert sorted(by_name["sweep hidden"]) == ["FINISHED", "KILLED"], by_name  # the new parent, the orphan closed
