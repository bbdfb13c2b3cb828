"""How ranks start on the real CI Slurm (scripts/slurm_up.sh), and what the user sees when they
cannot: launcher.pmi=auto's choice running a 2-rank point on a GPU partition (and its sbatch
lines), mpiexec inside an allocation (one node, and two namespace nodes), a PMI this Slurm cannot
give refused before anything starts, and a failed MPI start provoked on purpose and its cause in
the closing table."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from sweeper.points import TIMED_ALONE
from tests.test_slurm_nodes import MULTI, multinode
from tests.test_sweeper import FAST, SLURM, slurm, sweep
from tests.test_warm import only_sweep
from trainer import metrics

pytestmark = pytest.mark.mpi


def parent_of(uri: str):
    from tests.test_sweeper import parents

    (parent,) = parents(uri)
    return parent


@slurm
def test_mpiexec_inside_the_allocation_starts_the_ranks_without_srun(tmp_path, mlflow_uri):
    result = sweep(["hidden=16", "nproc=1,2", "dtype=float64", *FAST, *SLURM, "launcher.pmi=mpiexec"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    runs = only_sweep(mlflow_uri)
    points = {n: r.info.status for n, r in runs.items() if not n.endswith(TIMED_ALONE)}
    assert points == {"nproc=1": "FINISHED", "nproc=2": "FINISHED"}
    # Timed again alone in a second round of allocations where their timings had company (a loaded node).
    assert {r.info.status for n, r in runs.items() if n.endswith(TIMED_ALONE)} <= {"FINISHED"}
    assert runs["nproc=2"].data.tags["sweepscale.world_size"] == "2"
    assert runs["nproc=2"].data.metrics[metrics.weight_error("max")] < 1e-9
    assert "launcher.pmi=mpiexec as configured" in parent_of(mlflow_uri).data.tags[metrics.TAG_RANKS_START]
    for script in tmp_path.glob("multirun/*/*/.submitit/*/*_submission.sh"):
        assert "\nsrun " not in script.read_text()  # the job's one process starts the ranks itself


@slurm
@multinode
def test_mpiexec_spans_two_nodes_of_an_allocation(tmp_path, mlflow_uri):
    """Hydra starts a proxy on each node of the allocation: nproc=4 on node1 and node2."""
    result = sweep(["hidden=16", "nproc=4", *FAST, *MULTI, "launcher.pmi=mpiexec"], tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = only_sweep(mlflow_uri).values()
    assert run.info.status == "FINISHED" and run.data.tags["sweepscale.world_size"] == "4"
    assert run.data.tags["sweepscale.hosts"] == "node1,node2"
    devices = run.data.tags[metrics.TAG_RANK_DEVICES]
    assert devices.startswith("0=node1/cpu") and "3=node2/cpu" in devices  # each rank's node and device


@slurm
def test_a_pmi_this_slurm_cannot_load_is_refused_before_anything_starts(tmp_path, mlflow_uri):
    """CI's Slurm lists pmix but lacks the PMIx library it needs: srun cannot load it."""
    result = sweep(["hidden=16", "nproc=2", *FAST, *SLURM, "launcher.pmi=pmix"], tmp_path)
    assert result.returncode == 2
    assert "launcher.pmi=pmix, but this Slurm's srun does not offer it (mpi4py loads MPICH" in result.stderr
    assert "install the project's `mpich` extra" in result.stderr
    assert not Path(mlflow_uri.removeprefix("sqlite:///")).exists()  # nothing recorded
    queued = subprocess.run(["squeue", "-h", "-o", "%i|%Z"], capture_output=True, text=True).stdout.splitlines()
    mine = [line for line in queued if line.split("|")[-1].startswith(str(tmp_path))]  # other tests' jobs run beside
    assert not mine and not list(tmp_path.glob("multirun/*/*/.submitit/*/*_submission.sh")), mine


@slurm
def test_a_failed_mpi_start_shows_its_cause_in_the_closing_table(tmp_path, mlflow_uri):
    """srun without a PMI (--mpi=none, added on purpose) starts two singletons instead of a world of 2:
    the ranks stop before any run exists, and the table says why from the job's own stderr."""
    args = ["hidden=16", "nproc=2", *FAST, *SLURM, "launcher.srun_args=['--mpi=none']", "launcher.max_restarts=0"]
    result = sweep(args, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert " FAILED: gave up after 0 worker restart(s)" in result.stdout
    assert "srun started 2 tasks but MPI sees a world of 1" in result.stdout  # the cause's line from the job's log
    assert "log: " in result.stdout
    assert parent_of(mlflow_uri).info.status == "FAILED" and only_sweep(mlflow_uri) == {}  # no run was made


@slurm
def test_a_task_that_dies_before_mpi_ends_the_job_at_once_not_at_its_time_limit(tmp_path, mlflow_uri):
    """Task 1 cannot start Python (a task prolog breaks its environment) while task 0's rank waits
    in MPI_Init for it: srun's --kill-on-bad-exit ends the step, and the point FAILS within seconds
    instead of holding the allocation for launcher.timeout_min (10 min here)."""
    prolog = tmp_path / "prolog.sh"
    prolog.write_text('#!/bin/sh\nif [ "$SLURM_PROCID" = 1 ]; then echo "export PYTHONHOME=/nonexistent"; fi\n')
    prolog.chmod(0o755)
    args = ["hidden=16", "nproc=2", *FAST, *SLURM, f"launcher.srun_args=['--task-prolog={prolog}']"]
    result = sweep([*args, "launcher.max_restarts=0"], tmp_path, timeout=150)
    assert result.returncode == 1, result.stdout + result.stderr
    assert " FAILED: gave up after 0 worker restart(s)" in result.stdout
    assert parent_of(mlflow_uri).info.status == "FAILED" and only_sweep(mlflow_uri) == {}  # no rank made a run


@slurm
@multinode
def test_a_gpu_partition_gives_each_rank_a_gpu_and_auto_starts_them_with_srun_pmi2(tmp_path, mlflow_uri):
    """CI's partition `gpu` (node1, gres gpu:2, no GPU behind it): the preview asks one GPU per rank
    from the partition's own gres, and a point's ranks run there (on the CPU: no GPU is usable),
    started as launcher.pmi=auto chooses for the mpich wheel: srun --mpi=pmi2, a world of 2."""
    result = sweep(["hidden=16", "nproc=1,2", *FAST, *SLURM, "launcher.partition=gpu", "--dry-run"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "#SBATCH --gpus-per-node=1" in result.stdout and "#SBATCH --gpus-per-node=2" in result.stdout
    assert "1 node(s) x 2 task(s), 1 GPU each" in result.stdout
    result = sweep(["hidden=16", "nproc=2", *FAST, *SLURM, "launcher.partition=gpu"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = only_sweep(mlflow_uri).values()
    assert run.info.status == "FINISHED" and run.data.tags[metrics.TAG_RANK_DEVICES] == "0=node1/cpu; 1=node1/cpu"
    assert run.data.tags["sweepscale.world_size"] == "2"
    assert "ranks start: auto: mpi4py loads MPICH" in result.stdout and "srun --mpi=pmi2" in result.stdout
    said = parent_of(mlflow_uri).data.tags[metrics.TAG_RANKS_START]
    assert "srun --mpi=pmi2 on one node; across nodes " in said and said.endswith(
        "inside the allocation (srun's pmi2 cuts MPICH's long PMI lines)"
    )
    script = next(tmp_path.glob("multirun/*/*/.submitit/*/*_submission.sh")).read_text()
    assert "--mpi=pmi2" in script and "\nsrun " in script


@pytest.mark.gpu
@slurm
def test_a_slurm_point_on_a_gpu_records_its_gpu(tmp_path, mlflow_uri):
    """On a GPU machine's Slurm (scripts/slurm_gpu_node.sh: partition `gpu`), whatever way its ranks start."""
    result = sweep(["hidden=16", "nproc=1", *FAST, *SLURM, "launcher.partition=gpu", "device=gpu"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (run,) = only_sweep(mlflow_uri).values()
    assert run.info.status == "FINISHED" and run.data.tags["sweepscale.device"] == "gpu"
    assert run.data.tags[metrics.TAG_RANK_DEVICES].startswith(f"0={socket.gethostname()}/gpu0 (NVIDIA")
