"""Sweeps end to end: Hydra's grammar, per-point shapes, real local ranks, MLflow parent/child runs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir

from sweeper.runners import partition
from tests.conftest import NO_TIMING_FLOOR, ROOT, gpu_available, sweeper_command
from trainer import metrics
from trainer.record import store

pytestmark = pytest.mark.mpi
FAST = ["epochs=2", "batch_size=50", "data.n_train=200", "data.n_test=50", *NO_TIMING_FLOOR]


def sweep(
    args: list[str],
    cwd: Path,
    timeout: float = 240,
    env: dict | None = None,
    figures: bool = False,
    retime: bool = False,
) -> subprocess.CompletedProcess:
    """The sweep's command (:func:`sweeper_command`: figures and retimings off unless asked) in
    ``cwd``. One still running after ``timeout`` is stopped as a user's Ctrl-C would (its jobs
    cancelled) and the test fails with what it printed, its points' logs and the cluster's queue: a
    hang in CI then says where."""
    cmd = sweeper_command(args, figures, retime)
    pipe = subprocess.PIPE
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=pipe, stderr=pipe, text=True, env=env or os.environ)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        cluster = cluster_state()  # before the Ctrl-C cancels the jobs
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"the sweep ran past {timeout} s\n{hang_report(cwd, out, err)}{cluster}", pytrace=False)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def hang_report(cwd: Path, out: str, err: str) -> str:
    """What a sweep that hung leaves to read: its output and its points' logs' tails."""
    parts = [f"--- stdout\n{out[-6000:]}", f"--- stderr\n{err[-6000:]}"]
    linked = set()
    for log in sorted(cwd.glob("multirun/*/*/*/*.log")):
        try:
            linked.add(log.resolve())
            parts.append(f"--- {log.relative_to(cwd)}\n{log.read_text(errors='replace')[-3000:]}")
        except OSError as e:  # a link to a job's log not yet written
            parts.append(f"--- {log.relative_to(cwd)}: {e}")
    for log in sorted(cwd.glob("multirun/*/*/.submitit/*/*_log.*")):  # jobs no point was given to yet
        if log.resolve() not in linked:
            parts.append(f"--- {log.relative_to(cwd)}\n{log.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)


def cluster_state() -> str:
    """Slurm's queue and nodes, with their reasons, where Slurm answers."""
    if not shutil.which("squeue"):
        return ""
    said = ""
    for what in (["squeue", "-o", "%i %P %j %T %M %R"], ["sinfo", "-N", "-o", "%N %P %T %E"]):
        done = subprocess.run(what, capture_output=True, text=True)
        said += f"\n--- {what[0]}\n{done.stdout}{done.stderr}"
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    logs = re.findall(r"^Slurm(?:ctld|d)LogFile\s*=\s*(\S+)", config, re.M)
    for pattern in logs:  # the daemons' last words: a step that never started says why there
        for log in sorted(Path(pattern).parent.glob(Path(pattern).name.replace("%n", "*"))):
            try:
                said += f"\n--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:])
            except OSError as e:
                said += f"\n--- {log}: {e}"
    return said


def runs(uri: str):
    client = store.client(uri)
    exp = client.get_experiment_by_name("sweepscale")
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


def children_of(uri: str, parent_id: str):
    return {r.info.run_name: r for r in runs(uri) if r.data.tags.get("mlflow.parentRunId") == parent_id}


def parents(uri: str):
    return [r for r in runs(uri) if "mlflow.parentRunId" not in r.data.tags]


def compose_sweep(overrides: list[str]):
    from sweeper.config import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="sweep", overrides=overrides)


def test_labels_name_points_by_what_varies():
    from sweeper.points import labels

    points = [["hidden=512", "nproc=1", "epochs=2"], ["hidden=512", "nproc=2", "epochs=2"]]
    assert labels(points) == ["nproc=1", "nproc=2"]
    assert labels([["epochs=2", "sweep.force=true"]]) == ["epochs=2"]
    assert labels([["hidden=16", "launcher=slurm", "launcher.pmi=mpiexec", "+mlflow.tags.a=b"]]) == ["hidden=16"]


def test_slurm_shape_spreads_ranks_over_nodes():
    from sweeper.plan.shapes import trainer_config
    from sweeper.points import Point
    from sweeper.runners.slurm import SlurmRunner
    from trainer.errors import ConfigError

    cfg = compose_sweep(["launcher=slurm", "launcher.gpus_per_node=4", "launcher.max_nodes=2", "nproc=8"])
    point = Point(0, [], trainer_config(cfg), Path("."), "nproc=8")
    shape = SlurmRunner(cfg.launcher, Path("."), "test").shape(point)
    assert (shape.nodes, shape.tasks_per_node, shape.gpus_per_task) == (2, 4, 1)
    cfg = compose_sweep(["launcher=slurm", "launcher.gpus_per_node=4", "launcher.max_nodes=2", "nproc=9"])
    with pytest.raises(ConfigError, match=r"nproc=9 exceeds 2 node\(s\) x 4 ranks = 8; raise launcher.max_nodes"):
        SlurmRunner(cfg.launcher, Path("."), "test").shape(Point(0, [], trainer_config(cfg), Path("."), "nproc=9"))


def test_dry_run_lists_points_and_resources_without_submitting(tmp_path, mlflow_uri):
    result = sweep(["hidden=16,32", "nproc=1,2", *FAST, "--dry-run"], tmp_path)
    assert not (tmp_path / "multirun").exists(), "a preview leaves no sweep folder"
    assert result.returncode == 0, result.stderr
    for name in ("hidden=16,nproc=1", "hidden=32,nproc=2"):
        assert name in result.stdout
    assert "1 node(s) x 2 task(s), 1 CPU rank each" in result.stdout
    assert "estimate: none; no finished run in sqlite:///" in result.stdout  # and none created to look
    assert not Path(mlflow_uri.removeprefix("sqlite:///")).exists()
    assert not Path(os.environ["SWEEPSCALE_CACHE"]).exists(), "the reference cache's folder is tried, not left"


def test_a_preview_checks_neither_this_machines_cores_nor_its_data_and_a_sweep_does(tmp_path, mlflow_uri):
    """A laptop previews the cluster's study (#49): more ranks than its cores and a data folder it
    lacks are said, each point shown with its batch, epochs and data; the sweep itself is refused."""
    cores = os.cpu_count() or 1
    args = [f"nproc=1,{cores + 1}", "hidden=16", "data.dir=/nowhere/mnist", "epochs=3", "batch_size=100"]
    shown = sweep([*args, "launcher.cpus=null", "launcher.oversubscribe=false", "--dry-run"], tmp_path)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    row = next(line for line in shown.stdout.splitlines() if f"│ nproc={cores + 1} " in line)
    assert "100" in row and "│ 3 " in row and "/nowhere/mnist" in row and "(not here)" in row, row
    assert f"not on this machine: point nproc={cores + 1}: nproc={cores + 1} needs" in shown.stdout
    assert "data not checked here: data.dir=/nowhere/mnist: no such folder" in shown.stdout
    refused = sweep([*args, "launcher.cpus=null", "launcher.oversubscribe=false"], tmp_path)
    assert refused.returncode == 2 and "needs" in refused.stderr, refused.stdout + refused.stderr
    assert not (tmp_path / "multirun").exists() and not Path(mlflow_uri.removeprefix("sqlite:///")).exists()


def test_a_flag_before_dash_m_is_taken_as_it_is_after(tmp_path, mlflow_uri):
    """`python -m sweeper --dry-run -m ...` (#33): Hydra wants -m before its overrides; we put it there."""
    cmd = [sys.executable, "-m", "sweeper", "--dry-run", "-m", "hidden=16,32", *FAST]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "hidden=16" in result.stdout and "hidden=32" in result.stdout and "nothing submitted" in result.stdout
    assert not Path(mlflow_uri.removeprefix("sqlite:///")).exists()


def test_dry_run_on_slurm_shows_sbatch_lines(tmp_path, mlflow_uri):
    args = ["nproc=1,2", "hidden=8,16,24", "launcher=slurm", "launcher.ranks_per_node=2", "launcher.timeout_min=7"]
    result = sweep([*args, "launcher.warm=false", "launcher.array_parallelism=2", "--dry-run"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --ntasks-per-node=2" in result.stdout and "#SBATCH --time=7" in result.stdout
    assert "#SBATCH --signal=USR2@90" in result.stdout  # submitit's lead, shorter only for limits under 6 min
    assert result.stdout.count("#SBATCH --array=0-2%1") == 2  # array_parallelism=2 for the sweep: one job each
    assert "--mpi=pmi2" in result.stdout


def test_dry_run_on_slurm_needs_no_cluster(tmp_path, mlflow_uri):
    """No Slurm command on PATH (a laptop): the preview still shows the points and the sbatch lines,
    assumes what the partition would say, and says what it could not check."""
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # the venv's commands alone
    args = ["nproc=1,2", "hidden=8,16", "launcher=slurm", "launcher.partition=gpu", "--dry-run"]
    result = sweep(args, tmp_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "#SBATCH --partition=gpu" in result.stdout and "#SBATCH --gpus-per-node=2" in result.stdout
    assert "srun --unbuffered" in result.stdout and "--mpi=pmi2" in result.stdout  # the mpich wheel's
    assert "how the ranks start" in result.stdout
    assert "not checked: launcher=slurm: Slurm does not answer here" in result.stdout
    assert "The partition's limits are unknown here" in result.stdout
    assert not Path(mlflow_uri.removeprefix("sqlite:///")).exists()  # a preview records nothing


def test_a_sweep_on_slurm_without_slurm_is_refused_before_anything_starts(tmp_path, mlflow_uri):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}
    result = sweep(["hidden=8", "launcher=slurm"], tmp_path, env=env)
    assert result.returncode == 2
    assert "launcher=slurm: Slurm does not answer here" in result.stderr and "a login node" in result.stderr
    assert not Path(mlflow_uri.removeprefix("sqlite:///")).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["hiden=1,2"], "Key 'hiden' not in 'SweepConfig'"),
        (["lr=abc,0.1"], "Value 'abc' of type 'str' could not be converted to Float"),
        (["launcher=nope"], "Could not find 'launcher/nope'"),
        (["nproc=0,1"], "nproc=0: at least one MPI rank is needed"),
        (
            ["nproc=1,3", "launcher.cpus=2", "launcher.oversubscribe=false"],
            "nproc=3 needs 3 CPU cores but this machine has 2",
        ),
        (["hidden=range(0)"], "the sweep is empty: no point to run"),
        (["nproc=1,2", "launcher=debug"], "launcher=debug runs in this process, so nproc must be 1"),
        (["data.dir=/nonexistent/mnist"], "data.dir=/nonexistent/mnist: no such folder"),
        (["check.cache_dir=/proc/sweepscale"], "check.cache_dir=/proc/sweepscale: cannot write there"),
        (["+hiden=1,2"], "hiden is not a trainer key: it would change nothing; did you mean hidden?"),
        (["hidden=16,32", "hidden=8"], "hidden is given twice (hidden=16,32, hidden=8); keep one"),
        (["hydra.sweep.dir=/proc/sweeps"], "hydra.sweep.dir=/proc/sweeps: cannot write there"),
        (["launcher.folder=/proc/jobs"], "launcher.folder=/proc/jobs: cannot write there"),
        (["mlflow.experiment=" + "x" * 600], "mlflow.experiment: 600 characters, MLflow takes at most 500"),
    ],
)
def test_bad_input_stops_before_anything_is_submitted(args, message, tmp_path, mlflow_uri):
    result = sweep(args, tmp_path)
    assert result.returncode != 0
    assert message in result.stderr
    assert not Path(mlflow_uri.removeprefix("sqlite:///")).exists()
    assert not (tmp_path / "multirun").exists()  # no empty sweep folder left behind, nor multirun/


@pytest.mark.skipif(gpu_available(), reason="refused only where no GPU is usable: this machine has one")
def test_device_gpu_without_a_gpu_is_refused_before_any_rank_starts(tmp_path, mlflow_uri):
    """#47: `python -m trainer device=gpu` failed inside its rank, with a traceback and a FAILED run."""
    said = "device=gpu but no GPU is usable here"
    result = sweep(["hidden=8,16", "device=gpu", *FAST], tmp_path)
    assert result.returncode == 2 and said in result.stderr, result.stdout + result.stderr
    single = subprocess.run(
        [sys.executable, "-m", "trainer", "device=gpu", *FAST],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert single.returncode == 2 and said in single.stderr and "Traceback" not in single.stderr, single.stderr
    assert not Path(mlflow_uri.removeprefix("sqlite:///")).exists() and not (tmp_path / "multirun").exists()


def test_local_sweep_failure_isolation_and_resume(tmp_path, mlflow_uri):
    # hidden=32,nproc=2 fails on rank 1 (fault injection); the other three finish.
    args = ["hidden=16,32", "nproc=1,2", *FAST, "fault.rank=1", "fault.iteration=2"]
    result = sweep(args, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    (parent,) = parents(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id)
    assert set(kids) == {"hidden=16,nproc=1", "hidden=16,nproc=2", "hidden=32,nproc=1", "hidden=32,nproc=2"}
    status = {name: r.info.status for name, r in kids.items()}
    assert status["hidden=16,nproc=2"] == status["hidden=32,nproc=2"] == "FAILED"
    assert status["hidden=16,nproc=1"] == status["hidden=32,nproc=1"] == "FINISHED"
    for name, r in kids.items():
        assert r.data.tags["sweepscale.world_size"] == name[-1]
        assert r.data.tags[metrics.TAG_SWEEP_ID] == parent.data.tags[metrics.TAG_SWEEP_ID]
        assert r.data.tags[metrics.TAG_CONFIG_HASH]
    assert parent.info.status == "FAILED" and parent.data.params["sweep.points"] == "4"
    assert "fault injected on rank 1 at iteration 2" in result.stdout
    for name in ("hidden=16,nproc=2", "hidden=32,nproc=2"):  # rank 1 wrote it to rank 0's journal
        failed = kids[name]
        assert failed.data.tags[metrics.TAG_ERROR].startswith("rank 1: ")
        assert "fault injected on rank 1 at iteration 2" in failed.data.tags[metrics.TAG_ERROR]
        texts = {a.path for a in store.client(mlflow_uri).list_artifacts(failed.info.run_id)}
        assert "error-rank1.txt" in texts and failed.data.params["hidden"] == name[7:9]  # and the rest of it
    assert "stderr.log" in result.stdout  # the failed point's log path

    # The same sweep again: the finished points are skipped, the failed ones rerun.
    result = sweep(args, tmp_path)
    assert result.returncode == 1
    assert "skip hidden=16,nproc=1: FINISHED run" in result.stdout
    newest = max(parents(mlflow_uri), key=lambda r: r.info.start_time)
    assert set(children_of(mlflow_uri, newest.info.run_id)) == {"hidden=16,nproc=2", "hidden=32,nproc=2"}


def test_duplicated_grid_point_runs_once(tmp_path, mlflow_uri):
    result = sweep(["hidden=16,16", *FAST], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the same config as point 0, run once" in result.stdout
    (parent,) = parents(mlflow_uri)
    (kid,) = children_of(mlflow_uri, parent.info.run_id).values()
    assert kid.info.status == "FINISHED" and parent.info.status == "FINISHED"
    assert len(runs(mlflow_uri)) == 2  # the parent and one child, nothing duplicated


def test_sigterm_then_ctrl_c_cancels_jobs_and_marks_runs_killed(tmp_path, mlflow_uri):
    """SIGTERM, then an impatient Ctrl-C while the sweep cleans up: absorbed, nothing left RUNNING."""
    runs(mlflow_uri)  # create the store first: polling must not race the sweeper's schema set-up
    cmd = sweeper_command(["nproc=1", "epochs=100000", "data.n_train=200"])
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not any(
        r.info.status == "RUNNING" and "mlflow.parentRunId" in r.data.tags for r in runs(mlflow_uri)
    ):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    for _ in range(200):  # Ctrl-C every 50 ms until it ends: one lands while it cleans up, however fast
        time.sleep(0.05)
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted: cancelling the sweep's jobs" in out and "sweep summary" in out
    # Said by whichever phase the Ctrl-Cs landed in: ending the jobs, or (that done before one
    # landed, as seen once in a full run on two cores) the sweep's table and report.
    assert "still cleaning up" in out or "interrupted: the sweep's end (its table and report) first" in out, out
    statuses = {r.info.status for r in runs(mlflow_uri)}
    assert statuses == {"KILLED"}, statuses
    # The report of what there is still comes: the killed point listed, nothing drawn.
    (report,) = tmp_path.glob("multirun/*/*/report/points.csv")
    assert "nproc=1" in report.read_text() and "KILLED" in report.read_text()


def test_a_sweep_whose_sweeper_was_killed_is_closed_by_the_next(tmp_path, mlflow_uri):
    """SIGKILL of the sweeper and its jobs leaves runs RUNNING; the next sweep ends them KILLED."""
    runs(mlflow_uri)  # create the store first: polling must not race the sweeper's schema set-up
    cmd = sweeper_command(["nproc=1", "epochs=100000", "data.n_train=200"])
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.time() + 120
    while time.time() < deadline and not any(
        r.info.status == "RUNNING" and "mlflow.parentRunId" in r.data.tags for r in runs(mlflow_uri)
    ):
        time.sleep(0.5)
    for job in local_jobs(tmp_path):  # first the jobs (their own sessions), then the sweeper: a crash
        os.killpg(job, signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)  # the sweeper and everything it started: nobody ends the runs
    proc.wait()
    assert {r.info.status for r in runs(mlflow_uri)} == {"RUNNING"}
    result = sweep(["hidden=8", *FAST], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "its sweeper is gone; its runs left RUNNING are now KILLED" in result.stdout
    statuses = sorted(r.info.status for r in runs(mlflow_uri))
    assert statuses == ["FINISHED", "FINISHED", "KILLED", "KILLED"], statuses  # nothing left RUNNING
    killed = [r for r in runs(mlflow_uri) if r.info.status == "KILLED"]
    assert all("ended without closing the sweep's runs" in r.data.tags[metrics.TAG_ERROR] for r in killed)


def local_jobs(folder: Path) -> list[int]:
    """The process ids of a local sweep's jobs (a local job's id), each a session of its own."""
    return [int(d.name) for d in folder.glob("multirun/*/*/.submitit/*") if d.name.isdigit()]


def drawing_children(pid: int) -> list[int]:
    """The report's drawing processes a sweeper started (multiprocessing's spawned children)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and b"spawn_main" in (stat.parent / "cmdline").read_bytes():
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
    return found


def test_local_jobs_end_their_runs_when_the_sweeper_is_killed(tmp_path, mlflow_uri):
    """Local jobs run in sessions of their own (a terminal's Ctrl-C reaches the sweeper alone), yet
    end with it: the sweeper SIGKILLed alone, each job's trainer ends its run KILLED, no job (nor
    the report's drawing children) lives on; the next sweep closes the parent."""
    runs(mlflow_uri)  # create the store first: polling must not race the sweeper's schema set-up
    cmd = sweeper_command(["hidden=8,16", "epochs=100000", "data.n_train=200"], figures=True)  # its drawing children
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while (
        time.time() < deadline
        and sum(r.info.status == "RUNNING" and "mlflow.parentRunId" in r.data.tags for r in runs(mlflow_uri)) < 2
    ):
        time.sleep(0.5)
    jobs = local_jobs(tmp_path)
    assert jobs
    drawers = drawing_children(proc.pid)
    assert drawers  # started with the runs
    proc.kill()  # the sweeper alone
    proc.wait()
    deadline = time.time() + 60
    while time.time() < deadline and any(Path(f"/proc/{j}").exists() for j in jobs + drawers):
        time.sleep(0.5)
    assert not [j for j in jobs if Path(f"/proc/{j}").exists()], "a local job outlived its sweeper"
    assert not [d for d in drawers if Path(f"/proc/{d}").exists()], "a drawing child outlived its sweeper"
    kids = [r for r in runs(mlflow_uri) if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.info.status for r in kids) == ["KILLED", "KILLED"], [r.info.status for r in kids]
    result = sweep(["hidden=8", *FAST], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RUNNING" not in {r.info.status for r in runs(mlflow_uri)}


def slurm_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


_no_slurm = pytest.mark.skipif(
    not slurm_answers(), reason="no Slurm answers here (`sinfo` failed): CI starts one with scripts/slurm_up.sh"
)


def slurm(test):
    """A test of the real Slurm (tests/conftest.py runs them one at a time: they share its nodes)."""
    return pytest.mark.slurm(_no_slurm(test))


SLURM = ["launcher=slurm", "launcher.timeout_min=10"]  # ranks per node: the partition's (2 CPUs)


@slurm
def test_slurm_sweep_world_sizes_failures_and_resume(tmp_path, mlflow_uri):
    """The README's Slurm example on the one-node CI cluster (small data): ranks per node from the partition."""
    args = ["hidden=512,1024", "nproc=1,2", "launcher=slurm", "launcher.timeout_min=30", *FAST]
    result = sweep(args, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (parent,) = parents(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id)
    assert len(kids) == 4 and {r.info.status for r in kids.values()} == {"FINISHED"}
    for name, r in kids.items():
        assert r.data.tags["sweepscale.world_size"] == name[-1]  # srun's PMI made the world
        # Which job is which point: the run names its job, the summary what sacct says of it.
        shown = r.data.tags.get(metrics.TAG_SLURM_ARRAY, r.data.tags[metrics.TAG_SLURM_JOB])  # array task, or job
        lines = result.stdout.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(f"│ {name} "))
        row = " ".join(" ".join(lines[at : at + 2]).replace("│", " ").split())  # a cell may fold onto the next line
        # Its job serves other points: the state, time and node are the allocation's, and said so (#50).
        assert re.search(rf"{shown} (COMPLETED|COMPLETING|RUNNING) [\d:-]+ \S+", row), row
        assert "(warm worker)" in row, row
        job = r.data.tags[metrics.TAG_SLURM_JOB]
        submitted = [line for line in lines if line.startswith("slurm job ") and name in line]
        assert submitted and any(line.split()[2] in (job, shown) for line in submitted), lines[:20]
    assert parent.data.tags["sweepscale.scheduler"] == "slurm"
    for rank_log in tmp_path.glob("multirun/*/*/*/stderr.rank1.log"):  # the nproc=2 points': every rank's log
        assert rank_log.resolve().name.endswith("_1_log.err")
    assert len(list(tmp_path.glob("multirun/*/*/*/stderr.rank1.log"))) == 2

    result = sweep(args, tmp_path)
    assert result.returncode == 0
    assert result.stdout.count("skip hidden=") == 4


@slurm
def test_cold_points_slurm_holds_count_as_queued(tmp_path, mlflow_uri):
    """#33 item 15: while Slurm holds a cold sweep's array tasks (here 12 s, BeginTime), the progress
    line counts them queued, beside Slurm's reason, not running (also before the scheduler has
    looked at them: their reason is then "None", and CI saw that as running). #33 item 12: the
    closing table asks sacct of an array task as sacct names it (30_0), not by its own job id."""
    held = ["launcher.warm=false", "+launcher.sbatch_args={begin: 'now+12'}"]
    cmd = sweeper_command(["hidden=16,32", "nproc=1", *FAST, *SLURM, *held])
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:  # #50: sweeper.status names each point's job and Slurm's reason for holding it
        shown, deadline = "", time.monotonic() + 60
        while "PENDING (BeginTime)" not in shown and time.monotonic() < deadline and proc.poll() is None:
            status = [sys.executable, "-m", "sweeper.status"]
            shown = subprocess.run(status, cwd=tmp_path, capture_output=True, text=True, timeout=60).stdout
            time.sleep(0.5)
        assert "Slurm job" in shown and "PENDING (BeginTime)" in shown, shown
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    ended = subprocess.run([sys.executable, "-m", "sweeper.status"], cwd=tmp_path, capture_output=True, text=True)
    assert ended.stdout.count(" COMPLETED ") == 2, ended.stdout  # sacct's word once squeue has let them go
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, "")
    progress = [line for line in result.stdout.splitlines() if line.startswith("[sweep ")]
    assert any("queued 2" in line and "jobs pending: 2 BeginTime" in line for line in progress), progress
    assert not any("running" in line and "jobs pending: 2" in line for line in progress), progress
    (parent,) = parents(mlflow_uri)
    for name, r in children_of(mlflow_uri, parent.info.run_id).items():  # each point's task, found in sacct
        task = r.data.tags[metrics.TAG_SLURM_ARRAY]
        row = next(line for line in out.splitlines() if line.startswith(f"│ {name} "))
        assert re.search(rf"{task} (COMPLETED|COMPLETING|RUNNING) 00:00:\d\d", row), row
        assert f"slurm job {task.split('_')[0]}" in out or f"slurm job {task}" in out


@slurm
def test_slurm_failing_point_leaves_others_finished(tmp_path, mlflow_uri):
    """Of each shape's two points one fails (iteration 1000 is never reached) and the other
    finishes; a failed point's job is FAILED in sacct too: on one rank the warm worker served both
    points, then ended its job failed, and no other job was started for that shape. (The failing
    points come last in their queues: nproc=2's aborts its world, and no worker is needed after it.)"""
    args = ["hidden=16", "nproc=1,2", *FAST, *SLURM, "fault.rank=0", "fault.iteration=1000,1"]
    result = sweep(args, tmp_path)
    assert result.returncode == 1
    (parent,) = parents(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id).values()
    point = {f"{r.data.params['nproc']}/{r.data.params['fault.iteration']}": r for r in kids}
    status = {name: r.info.status for name, r in point.items()}
    assert status == {"1/1": "FAILED", "1/1000": "FINISHED", "2/1": "FAILED", "2/1000": "FINISHED"}
    tags = {name: r.data.tags for name, r in point.items()}  # an array task's id as sacct names it, else the job's
    job = {name: t.get(metrics.TAG_SLURM_ARRAY) or t[metrics.TAG_SLURM_JOB] for name, t in tags.items()}
    assert job["1/1"] == job["1/1000"], job  # one allocation served nproc=1's points
    said = partition.accounting([job["1/1"], job["2/1"]])
    assert said[job["1/1"]].startswith("FAILED") and said[job["2/1"]].startswith("FAILED"), said
    jobs = [line for line in result.stdout.splitlines() if line.startswith("slurm job ")]
    assert sum("x 1 task(s)" in line for line in jobs) == 1, jobs


@slurm
def test_slurm_failing_setup_line_fails_the_point(tmp_path, mlflow_uri):
    """A setup line fails every allocation alike: the job is not submitted again (#33 item 15: it
    was, max_restarts times), and the point fails with the line."""
    args = ["hidden=16", *FAST, *SLURM, "launcher.setup=['module load nosuchmodule','false']"]
    result = sweep(args, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the setup line failed" in result.stdout
    assert len([line for line in result.stdout.splitlines() if line.startswith("slurm job ")]) == 1, result.stdout
    (parent,) = parents(mlflow_uri)
    assert parent.info.status == "FAILED" and children_of(mlflow_uri, parent.info.run_id) == {}


@slurm
def test_slurm_scancel_ends_killed_and_sweep_reports(tmp_path, mlflow_uri):
    runs(mlflow_uri)  # create the store first: polling must not race the sweeper's schema set-up
    cmd = sweeper_command(["nproc=2", "epochs=100000", "data.n_train=200", *SLURM])
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not any(
        r.info.status == "RUNNING" and r.info.run_name != "" and "mlflow.parentRunId" in r.data.tags
        for r in runs(mlflow_uri)
    ):
        time.sleep(0.5)
    link = next(tmp_path.glob("multirun/*/*/0/stderr.log"))  # the point's folder leads to its job
    job_id = Path(os.readlink(link)).parent.name
    subprocess.run(["scancel", job_id], check=True)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    (kid,) = [r for r in runs(mlflow_uri) if "mlflow.parentRunId" in r.data.tags]
    assert kid.info.status == "KILLED", (kid.data.tags.get(metrics.TAG_ERROR), out[-4000:])
    assert "sweep summary" in out and "KILLED" in out, out[-4000:]


@slurm
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["launcher.partition=short", "launcher.timeout_min=10"],
            "launcher.timeout_min=10 x 1 point(s) per job = 10 min, but partition short's MaxTime is 5 min",
        ),
        (["nproc=4"], "nproc=4 exceeds 1 node(s) x 2 ranks = 2; raise launcher.max_nodes"),
        (
            ["launcher.ranks_per_node=4", "nproc=1"],
            "launcher.ranks_per_node=4 x cpus_per_task=1 CPUs, but partition debug's nodes have 2",
        ),
        (["launcher.max_nodes=3", "nproc=1"], "launcher.max_nodes=3, but partition debug lets a job span 1 node(s)"),
    ],
)
def test_slurm_points_the_partition_cannot_run_are_refused(args, message, tmp_path, mlflow_uri):
    """The one-node CI cluster (2 CPUs; partition short: MaxTime 5 min): refused, not pending forever."""
    result = sweep(["launcher=slurm", "hidden=8", *args, "--dry-run"], tmp_path, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stdout + result.stderr


@slurm
def test_a_pending_job_shows_as_pending_with_slurms_reason(tmp_path, mlflow_uri):
    """A job that may not start yet (sbatch --begin) pends: the progress says so and why; Ctrl-C ends it."""
    cmd = sweeper_command(["hidden=8", *FAST, *SLURM, "+launcher.sbatch_args.begin=now+1hour"])
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = lines_of(proc)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any("(jobs pending: 1 BeginTime)" in line for line in seen):
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
    finally:
        proc.kill()
    time.sleep(0.5)  # the reader's last lines
    out = "".join(seen)
    assert "(jobs pending: 1 BeginTime)" in out and proc.returncode == 130, out
    assert [r.info.status for r in runs(mlflow_uri)] == ["KILLED"]  # the parent; no child ever started
    jobs = [d.name for d in tmp_path.glob("multirun/*/*/.submitit/*") if d.name[0].isdigit()]
    assert jobs and not subprocess.run(["squeue", "-h", "-j", ",".join(jobs)], capture_output=True, text=True).stdout


@slurm
def test_a_job_sbatch_refuses_leaves_no_run_running(tmp_path, mlflow_uri):
    """sbatch refusing the sweep's job (here an option it rejects) stops the sweep with sbatch's words
    and the keys to look at, before its parent run: the allocations are asked for while the store
    opens. Nothing is recorded, no job is left, and no folder."""
    result = sweep(["hidden=8", *FAST, *SLURM, "+launcher.sbatch_args.hold=yes"], tmp_path, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    said = " ".join(result.stderr.split())
    assert "Error: sbatch refused the job array of 1 node(s) x 1 task(s)" in said, said
    assert "sbatch: option '--hold' doesn't allow an argument" in said and "check launcher.sbatch_args" in said
    assert "Traceback" not in result.stderr
    assert runs(mlflow_uri) == [] and not (tmp_path / "multirun").exists()


@slurm
def test_slurm_unknown_partition_surfaces_scheduler_message(tmp_path, mlflow_uri):
    result = sweep(["nproc=1,2", *SLURM, "launcher.partition=nosuchpart"], tmp_path)
    assert result.returncode == 2
    assert (
        "launcher.partition=nosuchpart: Slurm says:" in result.stderr and "invalid partition" in result.stderr.lower()
    )
    assert not Path(mlflow_uri.removeprefix("sqlite:///")).exists()


@slurm
@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("launcher.account=nosuchaccount", "Slurm's accounting has no account 'nosuchaccount'"),
        ("launcher.qos=nosuchqos", "Slurm's accounting has no qos 'nosuchqos'"),
        ("launcher.constraint=nosuchfeature", "Slurm refuses it ("),
    ],
)
def test_an_account_qos_or_constraint_slurm_refuses_stops_the_dry_run_too(key, message, tmp_path, mlflow_uri):
    """#33 item 14: asked of Slurm (its accounting; sbatch --test-only) before anything is submitted,
    also by --dry-run."""
    for extra in (["--dry-run"], []):
        result = sweep(["hidden=16", *FAST, *SLURM, key, *extra], tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"Error: {key}: {message}" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert not Path(mlflow_uri.removeprefix("sqlite:///")).exists()


def test_scaling_preset_keeps_batch_per_rank_constant():
    assert compose_sweep(["+experiment=scaling", "nproc=4"]).batch_size == 12800
    assert compose_sweep(["+experiment=scaling", "nproc=1"]).data.n_train == 38400


@pytest.mark.parametrize("preset", ["scaling", "lr_study", "hidden_study", "batch_study"])
def test_presets_expand_to_their_grids(preset, tmp_path, idx_dir, mlflow_uri):
    args = [
        f"+experiment={preset}",
        f"data.dir={idx_dir}",
        "data.n_train=60",
        "launcher=local",
        "launcher.cpus=4",  # nproc=4 is previewed, not run
        "--dry-run",
    ]
    result = sweep(args, tmp_path)
    assert result.returncode == 0, result.stderr
    expected = {
        "scaling": "hidden=2048,nproc=4",
        "lr_study": "lr=1.0",
        "hidden_study": "hidden=1024",
        "batch_study": "batch_size=512,nproc=4",
    }[preset]
    assert expected in result.stdout


def test_a_bad_tracking_uri_stops_the_sweep_before_any_job(tmp_path):
    result = sweep(["hidden=8,16", *FAST, "mlflow.tracking_uri=http://127.0.0.1:9"], tmp_path, timeout=60)
    assert result.returncode != 0
    assert "mlflow.tracking_uri=http://127.0.0.1:9: no tracking server answers" in result.stderr + result.stdout
    assert not list(tmp_path.rglob("todo")) and not list(tmp_path.rglob("*_submitted.pkl"))  # no queue, no job


def test_a_job_that_ends_well_but_records_no_run_is_failed(tmp_path, mlflow_uri):
    # An "mpiexec" that starts no rank and exits 0: the job ends without error, no run exists.
    args = ["hidden=8", "nproc=2", *FAST, "launcher.warm=false", "mpi.mpiexec=/bin/true"]
    result = sweep(args, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no run recorded" in result.stdout
    (parent,) = parents(mlflow_uri)
    assert parent.info.status == "FAILED" and children_of(mlflow_uri, parent.info.run_id) == {}


def test_two_sweeps_given_one_folder_write_two(tmp_path, mlflow_uri):
    """Started in the same second (here: the same hydra.sweep.dir, at once), two sweeps must not
    overwrite each other's point configs: each trains its own points, in its own folder (with
    launcher=debug: its points in the sweeper's own process)."""
    folder = tmp_path / "multirun" / "same"
    runs(mlflow_uri)  # the store first: MLflow's schema migration races between two new processes
    procs = [
        subprocess.Popen(
            sweeper_command([f"hidden={h}", *FAST, "launcher=debug", f"hydra.sweep.dir={folder}"]),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for h in ("8,12", "16,24")
    ]
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, out
    yamls = sorted(tmp_path.glob("multirun/same*/0/point.yaml"))
    assert [y.parent.parent.name for y in yamls] == ["same", "same-1"]
    for y in yamls:  # Hydra's multirun.yaml beside the points it names (#33 item 8)
        hidden = next(line for line in y.read_text().splitlines() if line.startswith("hidden:")).split()[1]
        assert f"hidden={hidden}" in (y.parent.parent / "multirun.yaml").read_text()
    assert {"hidden: 8", "hidden: 16"} == {
        next(line for line in y.read_text().splitlines() if line.startswith("hidden:")) for y in yamls
    }
    kids = [r for r in runs(mlflow_uri) if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.data.params["hidden"] for r in kids) == ["12", "16", "24", "8"]
    assert {r.info.status for r in kids} == {"FINISHED"}
    for parent in parents(mlflow_uri):  # each sweep's two points, one after the other, under its own parent
        assert parent.info.status == "FINISHED" and len(children_of(mlflow_uri, parent.info.run_id)) == 2


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("launcher.timeout_min=0", "launcher.timeout_min=0: a point needs at least 1 minute"),
        ("sweep.poll_s=-1", "sweep.poll_s=-1.0: the watch polls every poll_s seconds"),
        ("launcher.max_restarts=-1", "launcher.max_restarts=-1: 0 or more"),
        ("launcher=slurm launcher.timeout_min=1", "launcher.timeout_min=1: on Slurm a point needs at least 2 minutes"),
    ],
)
def test_bad_sweep_keys_stop_before_anything_is_recorded(override, message, tmp_path, mlflow_uri):
    result = sweep(["hidden=8", *FAST, *override.split()], tmp_path, timeout=60)
    assert result.returncode == 2 and f"Error: {message}" in result.stderr, result.stdout + result.stderr
    assert runs(mlflow_uri) == []  # no parent, no child: nothing half-written


def test_the_headline_grid_at_defaults_converges_on_the_embedded_digits(tmp_path, mlflow_uri):
    """hidden=512,1024,2048 at every default (CPU): no point diverges, each learns (issue #29)."""
    import csv

    result = sweep(["hidden=512,1024,2048", "device=cpu"], tmp_path, timeout=400, retime=True)  # every default
    assert result.returncode == 0, result.stdout + result.stderr
    with open(next(tmp_path.glob("multirun/*/*/report/points.csv"))) as f:
        rows = {row["point"]: row for row in csv.DictReader(f)}
    assert sorted(rows) == ["hidden=1024", "hidden=2048", "hidden=512"]
    for name, row in rows.items():
        assert row["status"] == "FINISHED" and row["diverged"] == "", (name, row["diverged"])
        assert float(row["final_precision"]) > 0.8 and float(row["final_loss"]) < 0.3, (name, row)
        assert row["check"] == "done" and float(row["weight_error_max"]) < 1e-3


def test_more_ranks_than_cores_share_them_flagged_and_not_timed_again(tmp_path, mlflow_uri):
    """The headline's nproc=1,2,4 on a laptop (#49): a point of more CPU ranks than the cores the
    launcher has runs with its ranks sharing them (each rank beyond the cores takes no lease), its
    speedup flagged; timed again alone its ranks would share the cores still, so it is not."""
    import csv

    many = 3  # ranks on launcher.cpus=2
    result = sweep(["hidden=16", f"nproc=1,{many}", *FAST, "launcher.cpus=2"], tmp_path, timeout=300, retime=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"nproc={many} on 2 CPU core(s): its ranks share them" in result.stdout
    with open(next(tmp_path.glob("multirun/*/*/report/points.csv"))) as f:
        rows = {row["point"]: row for row in csv.DictReader(f)}
    shared = rows[f"nproc={many}"]
    assert shared["status"] == "FINISHED" and shared["check"] == "done" and float(shared["weight_error_max"]) < 0.1, (
        shared
    )
    assert shared["timed_alone"] == "no" and not shared["timed_again_by"], shared  # flagged, not retimed
    names = {r.info.run_name for r in runs(mlflow_uri)}
    assert f"nproc={many} (timed alone)" not in names


def sigint_ignored(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT now (bit 1 of its SigIgn mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & 1 << (signal.SIGINT - 1))
    return False


def lines_of(proc: subprocess.Popen) -> list[str]:
    """Its output's lines so far, read by a thread (a wait on them has a deadline, never a read)."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return lines


def test_ctrl_c_twice_at_the_terminal_says_it_in_lines_not_tracebacks(tmp_path, mlflow_uri):
    """#33 item 10: a terminal's Ctrl-C reaches its whole foreground process group (here the
    sweeper's own session), twice: one line for each, no traceback from any process the sweep
    started, and every run ended KILLED. #47: the sweeper started with SIGINT ignored (nohup, a test
    harness) hears it all the same, and never ignores it itself (its drawing children do)."""
    runs(mlflow_uri)  # create the store first: polling must not race the sweeper's schema set-up
    cmd = sweeper_command(["hidden=8,16", "epochs=100000", "data.n_train=200"], figures=True)  # its drawing children
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # two workers, a core each: both points train when the Ctrl-C comes
    lines = lines_of(proc)
    deadline, ignored = time.time() + 120, []
    while time.time() < deadline and proc.poll() is None:
        if any(line.startswith("sweep ") for line in lines):  # its parent run: well past its signals' set-up
            ignored.append(sigint_ignored(proc.pid))
        if sum(r.info.status == "RUNNING" and "mlflow.parentRunId" in r.data.tags for r in runs(mlflow_uri)) == 2:
            break
        time.sleep(0.05)
    assert ignored and not any(ignored), f"SIGINT ignored in {sum(ignored)} of {len(ignored)} looks"
    os.killpg(proc.pid, signal.SIGINT)
    deadline = time.time() + 90
    while time.time() < deadline and not any("interrupted" in line for line in lines):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # the second as soon as the first is heard: the cleanup may take under a second
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the sweep did not end 90 s after two Ctrl-C:\n" + "".join(lines))
    time.sleep(0.5)  # the reader's last lines
    out = "".join(lines)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert "interrupted: cancelling the sweep's jobs" in out, out
    statuses = sorted(r.info.status for r in runs(mlflow_uri))
    assert statuses == ["KILLED"] * 3, statuses  # the parent and both points, nothing RUNNING


def test_sigterm_before_any_worker_started_ends_the_sweep_in_a_line(tmp_path, mlflow_uri):
    """#47: SIGTERM in a sweep's first second (composing, planning) ended the sweeper at once
    (rc -15); it ends it 130 in a line, with nothing recorded RUNNING."""
    runs(mlflow_uri)
    cmd = sweeper_command(["hidden=8,16,24,32", *FAST])
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = lines_of(proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the sweep did not end 90 s after SIGTERM:\n" + "".join(lines))
    time.sleep(0.5)
    out = "".join(lines)
    assert proc.returncode == 130, out
    assert "interrupted" in out and "Traceback" not in out, out
    assert not [r for r in runs(mlflow_uri) if r.info.status == "RUNNING"]


def test_a_sweep_totals_what_its_points_held(tmp_path, mlflow_uri):
    """#35: the parent run holds the sum of its points' core-seconds (GPU-seconds on GPUs), in all,
    training, and per nproc; the closing lines say the total beside the sweep's wall time, and the
    report's summary says it too. Its points timed with company (a run of this test timing beside
    them) and sweep.retime=false: none is timed again (tests/test_retime.py: with it)."""
    from trainer.ranks.contention import TimedSpan

    with TimedSpan("another sweep's run", exclusive=False, units="1 rank(s) on cpu"):
        result = sweep(["hidden=16", "nproc=1,2", *FAST, "sweep.retime=false"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "timing again" not in result.stdout
    (parent,) = parents(mlflow_uri)
    kids = children_of(mlflow_uri, parent.info.run_id)
    assert sorted(kids) == ["nproc=1", "nproc=2"] and {r.info.status for r in kids.values()} == {"FINISHED"}
    assert all(r.data.metrics[metrics.BESIDE] >= 1 for r in kids.values())  # they had company: retimed were it on
    held = {name: r.data.metrics[metrics.device_seconds("cpu")] for name, r in kids.items()}
    m = parent.data.metrics
    assert m[metrics.device_seconds("cpu")] == pytest.approx(sum(held.values()))
    training = sum(r.data.metrics[metrics.device_seconds("cpu", training=True)] for r in kids.values())
    assert m[metrics.device_seconds("cpu", training=True)] == pytest.approx(training)
    assert m[metrics.device_seconds("cpu") + "_nproc1"] == pytest.approx(held["nproc=1"])
    assert m[metrics.device_seconds("cpu") + "_nproc2"] == pytest.approx(held["nproc=2"])
    line = next(line for line in result.stdout.splitlines() if line.startswith("held: "))
    assert f"{sum(held.values()):.1f} core-seconds" in line and "s of the sweep" in line, line
    (summary,) = tmp_path.glob("multirun/*/*/report/summary.md")
    assert f"Held: {sum(held.values()):.1f} core-seconds" in summary.read_text()
    # A dry run of the same shapes (#49) estimates each from what its earlier run held: the part the
    # run held beside its epochs, plus its training per sample times the samples asked (here 3x the
    # epochs); a width no run has had shows no estimate, and the total counts what is known.
    longer = [o if o != "epochs=2" else "epochs=6" for o in FAST]
    shown = sweep(["hidden=16,24", "nproc=1,2", *longer, "--dry-run"], tmp_path)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    estimates = {cells[1]: cells[-1] for cells in table_rows(shown.stdout)}
    for name, run in kids.items():
        total, part = held[name], run.data.metrics[metrics.device_seconds("cpu", training=True)]
        assert estimates[f"hidden=16,{name}"] == f"{(total - part) + part * 3:.3g} core-s", estimates
    assert estimates["hidden=24,nproc=1"] == estimates["hidden=24,nproc=2"] == "-"
    assert "for 2 of 4 points, from earlier runs of their shape" in shown.stdout
    assert "2 point(s) have no earlier run of their shape" in shown.stdout


def table_rows(text: str) -> list[list[str]]:
    """The cells of each body row of a rich table as a pipe gets it (one line a row)."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
