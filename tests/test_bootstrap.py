"""How a Slurm point's ranks start (sweeper/runners/bootstrap.py): the choice for each MPI and the
plugins srun offers, explicit values honoured where Slurm can give them, refusals that name what
was found and the fixes. The table is pure; the real CI Slurm runs the choices it makes
(tests/test_slurm_bootstrap.py)."""

from __future__ import annotations

import pytest

from sweeper.points import Shape
from sweeper.runners.bootstrap import choose, family
from sweeper.runners.sbatch import slurm_parameters
from trainer.errors import ConfigError

MPICH = "MPICH Version:      5.0.2"
OPENMPI = "Open MPI v4.1.6, package: Debian OpenMPI, ident: 4.1.6, repo rev: v4.1.6, Sep 30, 2023"
BOTH = {"mpich": "/venv/bin/mpiexec", "openmpi": "/usr/bin/mpirun"}


@pytest.mark.parametrize(
    ("library", "plugins", "mpiexecs", "mode", "mpiexec"),
    [
        (MPICH, ["none", "pmi2", "pmix", "pmix_v4"], BOTH, "pmi2", None),
        (MPICH, ["none", "pmi2"], {}, "pmi2", None),
        (MPICH, ["none", "pmix", "pmix_v4"], BOTH, "mpiexec", "/venv/bin/mpiexec"),  # no pmi2: Hydra in the allocation
        (MPICH, ["none"], BOTH, "mpiexec", "/venv/bin/mpiexec"),
        (OPENMPI, ["none", "pmi2", "pmix", "pmix_v4"], BOTH, "pmix", None),
        (OPENMPI, ["none", "pmix_v4"], {}, "pmix", None),  # a versioned plugin offers pmix
        (OPENMPI, ["none", "pmi2"], BOTH, "mpiexec", "/usr/bin/mpirun"),  # the lent GPU machine's case
        (OPENMPI, ["none"], BOTH, "mpiexec", "/usr/bin/mpirun"),
        (MPICH, None, {}, "pmi2", None),  # Slurm does not answer here (a preview): the MPI's own plugin
        (OPENMPI, None, {}, "pmix", None),
    ],
)
def test_auto_picks_a_pair_that_works(library, plugins, mpiexecs, mode, mpiexec):
    chosen = choose("auto", library, plugins, mpiexecs)
    assert (chosen.mode, chosen.mpiexec) == (mode, mpiexec)
    assert chosen.srun == (mode != "mpiexec") and chosen.why.startswith("auto: mpi4py loads")


def test_mpich_jobs_across_nodes_start_with_hydra_not_srun_pmi2():
    """Slurm's pmi2 reads a PMI-1 line in one 1024-byte read; MPICH's address exchange across nodes
    sends longer ones, and the step hung in MPI_Init (3 of 25 two-node steps on CI's Slurm 22.05)."""
    chosen = choose("auto", MPICH, ["none", "pmi2"], BOTH)
    assert chosen.on(1) == chosen and chosen.on(1).srun and chosen.mode == "pmi2"
    wide = chosen.on(2)
    assert (wide.mode, wide.mpiexec, wide.srun) == ("mpiexec", "/venv/bin/mpiexec", False)
    assert "across nodes /venv/bin/mpiexec inside the allocation" in chosen.why
    wide_params = slurm_parameters(launcher(), Shape(2, 2, 0, False), "s", bootstrap=wide)
    narrow_params = slurm_parameters(launcher(), Shape(1, 2, 0, False), "s", bootstrap=chosen.on(1))
    assert wide_params["use_srun"] is False and not any("--mpi" in a for a in wide_params["srun_args"])
    assert "use_srun" not in narrow_params and "--mpi=pmi2" in narrow_params["srun_args"]
    # Without Hydra beside it, or asked for pmi2 by name, or Open MPI's pmix: srun's PMI on every shape.
    for kept in (
        choose("auto", MPICH, ["none", "pmi2"], {}),
        choose("pmi2", MPICH, ["none", "pmi2"], BOTH),
        choose("auto", OPENMPI, ["none", "pmix"], BOTH),
    ):
        assert kept.on(2) == kept and kept.srun


def launcher():
    from tests.test_sweeper import compose_sweep

    return compose_sweep(["launcher=slurm"]).launcher


@pytest.mark.parametrize(
    ("library", "plugins", "mpiexecs", "said"),
    [
        (OPENMPI, ["none", "pmi2"], {"mpich": "/venv/bin/mpiexec"}, "mpi4py loads Open MPI v4.1.6"),  # Hydra can't
        (MPICH, ["none"], {}, "srun offers --mpi=none, and no mpiexec of that MPI"),
        ("", ["none", "pmi2"], BOTH, "mpi4py loads no MPI"),  # mpi4py fails to load one
        ("Some Vendor MPI 1.0", ["pmi2"], BOTH, "mpi4py loads Some Vendor MPI 1.0"),
    ],
)
def test_auto_refuses_where_nothing_can_work(library, plugins, mpiexecs, said):
    with pytest.raises(ConfigError) as e:
        choose("auto", library, plugins, mpiexecs)
    message = str(e.value)
    assert message.startswith("launcher=slurm cannot start MPI ranks here: ") and said in message
    for fix in ("`mpich` extra", "launcher.pmi=pmix", "pmix plugin", "launcher.pmi=mpiexec"):
        assert fix in message


@pytest.mark.parametrize(
    ("pmi", "library", "plugins", "mpiexecs", "mode"),
    [
        ("pmi2", OPENMPI, ["none", "pmi2"], {}, "pmi2"),  # honoured: an Open MPI may be built with Slurm's PMI2
        ("pmix", MPICH, ["pmix"], {}, "pmix"),
        ("pmi2", MPICH, None, {}, "pmi2"),
        ("mpiexec", MPICH, ["pmi2"], BOTH, "mpiexec"),
    ],
)
def test_an_explicit_value_is_honoured_where_slurm_gives_it(pmi, library, plugins, mpiexecs, mode):
    chosen = choose(pmi, library, plugins, mpiexecs)
    assert chosen.mode == mode and f"launcher.pmi={pmi} as configured" in chosen.why


@pytest.mark.parametrize(
    ("pmi", "library", "plugins", "mpiexecs", "said"),
    [
        ("pmix", MPICH, ["none", "pmi2"], BOTH, "launcher.pmi=pmix, but this Slurm's srun does not offer it"),
        ("pmi2", OPENMPI, ["none", "pmix"], BOTH, "launcher.pmi=pmi2, but this Slurm's srun does not offer it"),
        ("mpiexec", OPENMPI, ["pmix"], {"mpich": "/venv/bin/mpiexec"}, "launcher.pmi=mpiexec, but no mpiexec of"),
    ],
)
def test_an_explicit_value_slurm_cannot_give_is_refused(pmi, library, plugins, mpiexecs, said):
    with pytest.raises(ConfigError, match=said):
        choose(pmi, library, plugins, mpiexecs)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (MPICH, "mpich"),
        ("HYDRA build details:\n    Version: 4.3.0", "mpich"),  # MPICH's mpiexec --version
        ("Intel(R) MPI Library for Linux* OS, Version 2021.10", "mpich"),
        ("MVAPICH2 Version: 2.3.7", "mpich"),
        (OPENMPI, "openmpi"),
        ("mpiexec (OpenRTE) 4.1.6", "openmpi"),  # Open MPI 4's mpiexec --version
        ("mpiexec (Open MPI) 5.0.3", "openmpi"),
        ("", "unknown"),
    ],
)
def test_the_mpi_family_is_read_from_version_texts(text, kind):
    assert family(text) == kind


def test_a_slurm_jobs_cpu_ranks_take_a_blas_thread_per_cpu_of_their_task():
    """numpy's BLAS otherwise starts a thread per CPU of the node in every rank: on CI's 2-CPU node
    a search's trials trained 3x slower through Slurm than locally (docs/benchmarks.md)."""
    from pathlib import Path

    from sweeper.runners.slurm import SlurmRunner
    from tests.test_sweeper import compose_sweep

    cfg = compose_sweep(["launcher=slurm", "launcher.pmi=pmi2", "launcher.cpus_per_task=3"])
    runner = SlurmRunner(cfg.launcher, Path("."), "t")
    keys = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    assert {runner.env(Shape(1, 2, 0, False))[k] for k in keys} == {"3"}
    assert not set(keys) & set(runner.env(Shape(1, 2, 1, False)))  # GPU ranks: the CPU check keeps its threads
