"""The runners without a cluster: dispatch by class, the sbatch preview against its golden file
(as submitit tests its own sbatch text), and the one spelling of a launcher's time limit."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_sweeper import compose_sweep

GOLDEN = ROOT / "tests" / "data" / "sbatch_preview.txt"
# A fixed config touching every key the preview renders; its folder is absolute so the text is fixed.
GOLDEN_LAUNCHER = [
    "launcher=slurm",
    "launcher.partition=gpu",
    "launcher.account=proj",
    "launcher.qos=high",
    "launcher.mem=32G",
    "launcher.constraint=h100",
    "launcher.timeout_min=30",
    "launcher.gpus_per_node=4",
    "launcher.max_nodes=2",
    "launcher.cpus_per_task=8",
    "launcher.pmi=pmix",
    "launcher.array_parallelism=2",
    "launcher.folder=/sweeps/demo/.submitit",
    "launcher.points_per_job=2",  # warm: three points make a job array of two allocations
    "+launcher.sbatch_args.reservation=mine",
    "launcher.srun_args=['--cpu-bind=none']",
    "launcher.setup=['module load cuda','export OMP_NUM_THREADS=1']",
]


def golden_preview() -> tuple[str, dict]:
    from sweeper.points import Shape
    from sweeper.runners.base import make_runner

    cfg = compose_sweep(GOLDEN_LAUNCHER)
    runner = make_runner(cfg.launcher, Path("/unused"), "sweepscale-golden")
    shape = Shape(nodes=2, tasks_per_node=4, gpus_per_task=1)
    groups = {shape: [None, None, None]}  # three points of one shape: one array of two chunks
    scripts = runner.preview(groups)
    assert scripts.pop("how the ranks start") == "launcher.pmi=pmix as configured"
    (text,) = scripts.values()
    assert f"{shlex.quote(sys.executable)} -u -m submitit.core._submit" in text  # this Python, as submitted
    return text.replace(shlex.quote(sys.executable), "python"), runner.parameters(shape, 2)


def test_sbatch_preview_matches_golden_file():
    text, _ = golden_preview()
    assert text + "\n" == GOLDEN.read_text(), f"preview changed; if on purpose, write it to {GOLDEN}"


def test_sbatch_preview_is_what_submitit_writes():
    """Our rendering against submitit's own (private) one: catches a submitit upgrade that changes it."""
    slurm = pytest.importorskip("submitit.slurm.slurm")
    text, params = golden_preview()
    script = slurm._make_sbatch_string(
        command="python -u -m submitit.core._submit", folder="/sweeps/demo/.submitit/%j", map_count=2, **params
    )
    theirs = [line for line in script.splitlines() if line.startswith(("#SBATCH", "srun"))]
    theirs[-1:-1] = params["setup"]  # setup lines come between the #SBATCH lines and srun
    assert text.splitlines() == theirs


@pytest.mark.parametrize(
    ("launcher", "cls"),
    [("local", "LocalRunner"), ("slurm", "SlurmRunner"), ("debug", "DebugRunner")],
)
def test_launcher_config_names_its_runner_class(launcher, cls, tmp_path):
    from sweeper.runners.base import Runner, make_runner

    cfg = compose_sweep([f"launcher={launcher}"])
    runner = make_runner(cfg.launcher, tmp_path, "sweepscale-test")
    assert type(runner).__name__ == cls and isinstance(runner, Runner)
    assert runner.scheduler == launcher  # the parent run's sweepscale.scheduler tag
    assert cfg.launcher.timeout_min == 60 and "folder" in cfg.launcher  # the shared base


def test_sweeper_has_no_launcher_name_branches():
    sources = [*(ROOT / "sweeper").rglob("*.py"), *(ROOT / "hydra_plugins").rglob("*.py")]
    assert not [f for f in sources if re.search(r"launcher\.name\b|launcher\[.name.\]", f.read_text())]
    assert "name" not in compose_sweep(["launcher=slurm"]).launcher  # the class is the launcher's identity


def test_points_module_is_a_leaf():
    tree = ast.parse((ROOT / "sweeper" / "points.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m.split(".")[0] in ("sweeper", "trainer")}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("launcher.time_min=7", "launcher.time_min is now launcher.timeout_min"),
        ("tf32=true", "tf32 is now gpu.gemm=tf32"),  # the trainer's moved keys, checked at the same place
    ],
)
def test_old_spellings_name_the_new_key(override, message, tmp_path):
    cmd = [sys.executable, "-m", "sweeper", "-m", "launcher=slurm", override, "--dry-run"]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert message in result.stderr


def test_array_parallelism_caps_the_whole_sweep():
    from sweeper.runners.sbatch import share

    assert share(16, [3, 5]) == [3, 5]  # room for every job
    assert share(4, [2, 6]) == [1, 3]  # in proportion
    assert share(3, [4, 4, 4]) == [1, 1, 1]
    assert share(2, [3, 3, 3]) == [1, 1, 1]  # each array runs: more arrays than the cap exceed it


def test_exclusive_timing_asks_slurm_for_whole_nodes():
    """perf.timing=exclusive: a point's job has its nodes alone (#SBATCH --exclusive), as submitit writes it."""
    slurm = pytest.importorskip("submitit.slurm.slurm")
    from sweeper.points import Shape
    from sweeper.runners.base import make_runner

    runner = make_runner(compose_sweep(GOLDEN_LAUNCHER).launcher, Path("/unused"), "sweepscale-golden")
    shape = Shape(nodes=2, tasks_per_node=4, gpus_per_task=1, exclusive=True)
    (text,) = [t for title, t in runner.preview({shape: [None]}).items() if title.startswith("job array")]
    assert "#SBATCH --exclusive" in text.splitlines()
    params = runner.parameters(shape, 1)
    script = slurm._make_sbatch_string(command="x", folder="/sweeps/demo/.submitit/%j", map_count=1, **params)
    assert "#SBATCH --exclusive" in script.splitlines()
    assert "#SBATCH --exclusive" not in runner.preview({Shape(2, 4, 1): [None]}).popitem()[1]
