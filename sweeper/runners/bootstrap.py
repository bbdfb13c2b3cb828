"""How a Slurm point's ranks start and find each other, chosen to fit the cluster before anything
is submitted: each Slurm task a rank through srun's PMI (``--mpi=pmi2`` for MPICH, ``--mpi=pmix``
for Open MPI), or, where srun offers no PMI the MPI library speaks, one process per allocation
that starts the ranks with that library's own mpiexec inside the allocation (Open MPI's mpirun and
MPICH's Hydra both read Slurm's allocation and start ranks on its nodes).

``launcher.pmi``: ``auto`` (the default) asks which MPI mpi4py loads and which plugins ``srun
--mpi=list`` offers, and picks a pair that works (:func:`choose`, pure, holds the table);
``pmi2``, ``pmix`` or ``mpiexec`` are honoured as given where this Slurm can give them.

With MPICH, ``auto`` starts a job that spans nodes with Hydra's mpiexec even where srun offers
pmi2: Slurm's pmi2 plugin reads each PMI-1 command in one 1024-byte read, and MPICH's address
exchange across nodes sends longer lines, so slurmstepd cuts them ("value not properly terminated
in client request") and the step fails or hangs in MPI_Init (docs/benchmarks.md, "Two nodes").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from trainer.errors import ConfigError

MODES = ("pmi2", "pmix", "mpiexec")
FIXES = (
    "install the project's `mpich` extra so that mpi4py loads MPICH (srun --mpi=pmi2), "
    "have Slurm's pmix plugin installed for Open MPI (launcher.pmi=pmix), "
    "or set launcher.pmi=mpiexec with your MPI's mpiexec on PATH (mpi.mpiexec names another)"
)


@dataclass(frozen=True)
class Bootstrap:
    mode: str  # pmi2 | pmix: srun starts the ranks with --mpi=<mode>; mpiexec: mpiexec does, inside the allocation
    mpiexec: str | None  # the mpiexec of mode mpiexec
    why: str  # one line: what was found and what it led to
    across_nodes: str | None = None  # an mpiexec that starts jobs spanning nodes instead of srun's PMI

    @property
    def srun(self) -> bool:
        return self.mode != "mpiexec"

    def on(self, nodes: int) -> Bootstrap:
        """How the ranks of a job of ``nodes`` nodes start: ``across_nodes`` where it spans several."""
        if nodes > 1 and self.across_nodes:
            return Bootstrap("mpiexec", self.across_nodes, self.why)
        return self


def family(text: str) -> str:
    """mpich (MPICH, Intel MPI, MVAPICH: Hydra's mpiexec), openmpi, or unknown, from a library's
    version string or an mpiexec's ``--version``."""
    t = text.lower()
    if "open mpi" in t or "openrte" in t:
        return "openmpi"
    if any(name in t for name in ("mpich", "hydra", "intel(r) mpi", "mvapich")):
        return "mpich"
    return "unknown"


def choose(pmi: str, library: str, plugins: list[str] | None, mpiexecs: dict[str, str]) -> Bootstrap:
    """The bootstrap for ``launcher.pmi`` given the MPI library mpi4py loads (its version line), the
    plugins srun offers (None: unknown, Slurm does not answer here) and the mpiexec found for each
    MPI family. Raises ConfigError, naming what was found and the fixes, where none can work."""
    kind = family(library)
    offered = None if plugins is None else {p.split("_")[0] for p in plugins}  # pmix_v4 offers pmix
    found = f"mpi4py loads {library.strip() or 'no MPI'}; srun offers --mpi={','.join(plugins or ['?'])}"
    if pmi in ("pmi2", "pmix"):
        if offered is not None and pmi not in offered:
            raise ConfigError(f"launcher.pmi={pmi}, but this Slurm's srun does not offer it ({found}); {FIXES}")
        return Bootstrap(pmi, None, f"launcher.pmi={pmi} as configured ({found})" if plugins else configured(pmi).why)
    if pmi == "mpiexec":
        if kind not in mpiexecs:
            raise ConfigError(
                f"launcher.pmi=mpiexec, but no mpiexec of {library.strip() or 'this MPI'} is found ({found}); {FIXES}"
            )
        return Bootstrap("mpiexec", mpiexecs[kind], f"launcher.pmi=mpiexec as configured: {mpiexecs[kind]}")
    if pmi != "auto":
        raise ConfigError(f"launcher.pmi={pmi}: expected auto, {', '.join(MODES)}")
    wanted = {"mpich": "pmi2", "openmpi": "pmix"}.get(kind)
    if wanted is not None and (offered is None or wanted in offered):
        across = mpiexecs.get("mpich") if wanted == "pmi2" else None
        why = f"auto: {found}: srun --mpi={wanted}"
        if across:  # the module's docstring says why
            why += (
                f" on one node; across nodes {across} inside the allocation (srun's pmi2 cuts MPICH's long PMI lines)"
            )
        return Bootstrap(wanted, None, why, across)
    if kind in mpiexecs:
        return Bootstrap(
            "mpiexec", mpiexecs[kind], f"auto: {found}, no PMI of this MPI: {mpiexecs[kind]} inside the allocation"
        )
    raise ConfigError(f"launcher=slurm cannot start MPI ranks here: {found}, and no mpiexec of that MPI; {FIXES}")


def detect(pmi: str, configured_mpiexec: str | None, partition: str | None = None) -> Bootstrap:
    """:func:`choose` with what this machine says: the library mpi4py loads in this Python (the
    jobs' too), srun's plugins, and the mpiexecs found (``mpi.mpiexec`` first)."""
    from sweeper.runners.partition import answers

    here = shutil.which("srun") is not None and answers()
    if pmi in ("pmi2", "pmix") and not here:
        return configured(pmi)  # nothing here to check it against
    plugins = srun_plugins(partition) if here else None  # srun's tries would wait for a controller
    return choose(pmi, mpi_library(), plugins, mpiexecs(configured_mpiexec))


def configured(pmi: str) -> Bootstrap:
    """An explicit srun plugin as it is, unchecked (the preview's; :func:`detect` checks it)."""
    return Bootstrap(pmi, None, f"launcher.pmi={pmi} as configured")


def mpi_library() -> str:
    """The first line of MPI_Get_library_version as mpi4py reports it, from a fresh interpreter (a
    site's wheel may load another libmpi than the one its name suggests); "" when mpi4py fails."""
    code = "from mpi4py import MPI; print(MPI.Get_library_version().replace(chr(0), '').strip().splitlines()[0])"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def srun_plugins(partition: str | None = None) -> list[str] | None:
    """The plugins of ``srun --mpi=list`` (pmi2, pmix, pmix_v4, none, ...) that srun can load: a
    listed pmi2 or pmix is tried with ``srun --test-only`` (Debian lists pmix without the PMIx
    library it needs); None where srun is not here."""
    try:
        out = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout + out.stderr
    names = [line.strip() for line in text.splitlines() if line.startswith(("\t", " ")) and line.strip()]
    extra = [w.strip() for line in text.splitlines() if "versions available:" in line for w in line.split(":")[1:]]
    names += [w for part in extra for w in part.split(",") if w]
    where = [f"--partition={partition}"] if partition else []
    for plugin in ("pmi2", "pmix"):
        if plugin in names and not _loads(plugin, where):
            names = [n for n in names if n.split("_")[0] != plugin]
    return names


def _loads(plugin: str, where: list[str]) -> bool:
    """Whether srun loads the plugin (it does so before it asks for resources: a partition's own
    refusal says nothing of the plugin)."""
    cmd = ["srun", f"--mpi={plugin}", "--test-only", "-n1", *where, "true"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 or "Invalid MPI type" not in out.stderr


def mpiexecs(configured: str | None) -> dict[str, str]:
    """MPI family -> an mpiexec of it: mpi.mpiexec, the one beside this Python (the mpich wheel's),
    then mpiexec and mpirun on PATH; the first of each family wins."""
    candidates = [configured] if configured else []
    candidates += [shutil.which("mpiexec", path=os.path.dirname(sys.executable)), shutil.which("mpiexec")]
    candidates.append(shutil.which("mpirun"))
    out: dict[str, str] = {}
    for path in dict.fromkeys(c for c in candidates if c):
        found = shutil.which(path)
        if found is None:
            continue
        try:
            version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        out.setdefault(family(version.stdout + version.stderr), found)
    out.pop("unknown", None)
    return out
