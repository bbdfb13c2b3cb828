"""Slurm across nodes: node1 and node2 of `SLURM_CI_NODES=2 bash scripts/slurm_up.sh`, each a
slurmd in its own network and UTS namespace (own address, own hostname), partition `multi`.
A point wider than a node spans two; a node going down takes only its own point with it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeper.points import TIMED_ALONE
from tests.conftest import ROOT, job_runner_commands, sweeper_command
from tests.test_docker import postgres_answers
from tests.test_slurm_requeue import start_now, wait_for
from tests.test_sweeper import FAST, SLURM, runs, slurm, slurm_answers, sweep
from tests.test_tracking_server import free_port
from tests.test_warm import only_sweep
from trainer import metrics
from trainer.record import checkpoint, store

MLFLOW = str(Path(sys.executable).parent / "mlflow")

pytestmark = pytest.mark.mpi

MULTI = [*SLURM, "launcher.partition=multi"]  # 2 CPUs a node: ranks per node and nodes from the partition


def multi_nodes() -> list[str]:
    if not slurm_answers():
        return []
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "multi", "-o", "%N"], capture_output=True, text=True)
    return sorted(set(out.stdout.split()))


multinode = pytest.mark.skipif(
    len(multi_nodes()) < 2,
    reason="no partition `multi` of 2 nodes: CI starts one with SLURM_CI_NODES=2 bash scripts/slurm_up.sh",
)


def controller_address() -> str:
    """The address the nodes reach this machine at: the controller's (SlurmctldHost=name(addr))."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    return re.search(r"SlurmctldHost\[0\]\s*=\s*[^(\s]+\(([^)]+)\)", config).group(1)


@pytest.fixture
def bridge_server(tmp_path):
    """A tracking server on the real PostgreSQL, listening where the nodes reach it (a namespace's
    127.0.0.1 is its own): scripts/tracking_up.sh as the README's cluster section runs it."""
    if not postgres_answers():
        pytest.skip("no PostgreSQL: CI starts one with scripts/tracking_up.sh")
    host, port, base = controller_address(), str(free_port()), tmp_path / "server"
    env = {**os.environ, "MLFLOW_HOST": host, "MLFLOW_PORT": port, "BASE": str(base), "MLFLOW": MLFLOW}
    up = subprocess.run(["bash", str(ROOT / "scripts" / "tracking_up.sh")], env=env, capture_output=True, text=True)
    assert up.returncode == 0, up.stdout + up.stderr
    pid = int((base / "mlflow-server.pid").read_text())
    try:
        yield f"http://{host}:{port}"
        # MLflow's job runner is off (it would have started by the sweep's end)
        assert not job_runner_commands(pid)
    finally:
        os.killpg(os.getpgid(pid), signal.SIGTERM)  # the server and its workers (setsid: their own group)


@slurm
@multinode
def test_a_sweep_of_one_and_two_node_shapes_spans_the_nodes(tmp_path, bridge_server):
    """nproc=4 with 2 ranks a node runs on both nodes (world size 4, weights equal to the
    sequential reference's); nproc=2 fits on one. Every rank logs to the tracking server."""
    grid = ["hidden=16", "nproc=2,4", "dtype=float64", *FAST, *MULTI, f"mlflow.tracking_uri={bridge_server}"]
    grid += [
        "model.init=fan_in",
        "data.scale=unit",
    ]  # pixels in [0, 1]: float64 sums differ by ~1e-15, not bytes' 1e-11
    experiment = f"nodes-{time.time_ns()}"
    result = sweep([*grid, f"mlflow.experiment={experiment}"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    client = store.client(bridge_server)
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    (parent,) = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FINISHED"
    # MPICH across nodes starts with Hydra, not srun's pmi2, which cut its long PMI lines and hung MPI_Init
    assert "across nodes" in parent.data.tags[metrics.TAG_RANKS_START]
    kids = {r.info.run_name: r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    again = {n for n in kids if n.endswith(TIMED_ALONE)}  # timed again alone where their timings had company
    points = {n: r.info.status for n, r in kids.items() if n not in again}
    assert points == {"nproc=2": "FINISHED", "nproc=4": "FINISHED"}
    assert {kids[n].info.status for n in again} <= {"FINISHED"} and again <= {f"nproc={n}{TIMED_ALONE}" for n in (2, 4)}
    wide, narrow = kids["nproc=4"].data, kids["nproc=2"].data
    assert wide.tags["sweepscale.hosts"] == "node1,node2" and wide.tags["sweepscale.world_size"] == "4"
    assert narrow.tags["sweepscale.hosts"] in ("node1", "node2") and narrow.tags["sweepscale.world_size"] == "2"
    for run in (wide, narrow):  # the all-reduce across nodes: the reference replays the same batches
        assert run.metrics[metrics.weight_error("max")] < 1e-12, run.metrics
    nodes = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-j", wide.tags[metrics.TAG_SLURM_JOB], "-o", "NNodes"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert nodes and nodes[0] == "2", nodes  # one allocation of two nodes, as Slurm accounts it


EPOCHS = 400  # each point's, in the node test: 4 steps an epoch


def steps_of(raw_job_id: str) -> list[str]:
    """This machine's slurmstepd processes of a job (its batch script's and its steps')."""
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in ps if line.startswith(f"slurmstepd: [{raw_job_id}.")]


def node_of(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True).stdout.strip()


@slurm
@multinode
def test_a_node_going_down_mid_sweep_requeues_only_its_point(tmp_path, mlflow_uri):
    """Two points, one on each node; node2 is set DOWN while both train. Slurm kills and requeues
    the job on node2 only: its point resumes from its checkpoint into the same run, the other
    point never notices."""
    runs(mlflow_uri)  # create the store first: polling must not race the sweeper's schema set-up
    # Long enough that node2's point still trains when the second checkpoint appears (150 epochs
    # were once done by then, and Slurm had nothing to requeue).
    grid = [
        "seed=1,2",
        "hidden=16",
        "nproc=2",
        f"epochs={EPOCHS}",
        "batch_size=50",
        "data.n_train=200",
        "data.n_test=50",
    ]
    cmd = sweeper_command([*grid, *MULTI, "launcher.points_per_job=1"])  # a job each
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    jobs: dict[str, str] = {}
    try:
        for index in ("0", "1"):
            ckpt = f"multirun/*/*/{index}/{checkpoint.FILE}"
            wait_for(f"point {index}'s checkpoint", lambda c=ckpt: any(tmp_path.glob(c)))
            (link,) = tmp_path.glob(f"multirun/*/*/{index}/stderr.log")
            job = Path(os.readlink(link)).parent.name
            jobs[node_of(job)] = job
        assert sorted(jobs) == ["node1", "node2"], jobs  # each point fills a node (2 ranks, 2 CPUs)
        raw = subprocess.run(["squeue", "-h", "-j", jobs["node2"], "-o", "%A"], capture_output=True, text=True)
        subprocess.run(["scontrol", "update", "nodename=node2", "state=down", "reason=sweepscale test"], check=True)
        # The node is back at once (its slurmd answers: ReturnToService=2), unlike a dead one: let
        # the killed job's processes end there before it starts again ("already running" otherwise).
        wait_for("the killed job's steps gone", lambda: not steps_of(raw.stdout.strip()))
        start_now(jobs["node2"], since=0)  # Slurm may have requeued it already
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()  # a sweep that hangs must not outlive the test (nor its jobs)
        subprocess.run(["scancel", *jobs.values()], capture_output=True, check=False)
        subprocess.run(["scontrol", "update", "nodename=node2", "state=resume"], capture_output=True, check=False)
    assert proc.returncode == 0, out
    kids = only_sweep(mlflow_uri)
    assert {r.info.status for r in runs(mlflow_uri)} == {"FINISHED"}, out  # the parent too: nothing RUNNING
    by_job = {r.data.tags[metrics.TAG_SLURM_ARRAY]: r for r in kids.values()}
    hit, spared = by_job[jobs["node2"]], by_job[jobs["node1"]]
    assert hit.data.tags.get(metrics.TAG_RESTARTS) == "1" and metrics.TAG_RESUMED_FROM_EPOCH in hit.data.tags
    assert metrics.TAG_RESTARTS not in spared.data.tags
    said = " ".join(out.split())  # the requeue told as it happened, with its cause; its allocations counted
    assert f"slurm job {jobs['node2']}: requeued after NODE_FAIL" in said, out
    assert "3 allocation(s), 1 of them ended by a requeue" in said, out
    for run in (hit, spared):  # every step once, none lost
        steps = sorted(m.step for m in _history(mlflow_uri, run.info.run_id, metrics.TRAIN_LOSS))
        assert steps == list(range(EPOCHS * 4))


def _history(uri: str, run_id: str, key: str):
    return store.client(uri).get_metric_history(run_id, key)
