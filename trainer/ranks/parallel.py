"""MPI between ranks: how the ranks start, the world-size guard, the small collectives waited on asleep.

``python -m trainer nproc=N`` started by hand re-runs itself under ``mpiexec -n N``; started by
mpiexec or srun, it checks that the world it landed in has N ranks.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.errors import ConfigError

# Set by MPICH/Hydra and PMI2 (PMI_*), Open MPI (OMPI_*) and PMIx (PMIX_*) in every rank.
LAUNCHER_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


def launched_by_mpi() -> bool:
    """True inside a rank that mpiexec/mpirun/srun started (also a srun task without PMI)."""
    return any(k in os.environ for k in LAUNCHER_ENV) or "SLURM_STEP_NUM_TASKS" in os.environ


def launcher_rank() -> int:
    """This process's rank as its launcher set it, before MPI is initialised (0 if none)."""
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def find_mpiexec(explicit: str | None) -> str:
    """The configured mpiexec, else the one beside this Python (the mpich wheel's), else PATH."""
    if explicit:
        found = shutil.which(explicit)
        if not found:
            raise ConfigError(f"mpi.mpiexec={explicit}: not found; give the path of an mpiexec")
        return found
    beside = shutil.which("mpiexec", path=os.path.dirname(sys.executable))
    found = beside or shutil.which("mpiexec")
    if not found:
        raise ConfigError(
            "nproc>1 needs mpiexec, and none is installed: `pip install mpich` (or the project's "
            "`[mpich]` extra), load your site's MPI module, or set mpi.mpiexec=/path/to/mpiexec"
        )
    return found


# A local run's ranks (one host) listen on loopback only: MPICH's UCX and libfabric transports on
# lo; Open MPI without its TCP transport (it listens on every address; shared memory carries all).
LOOPBACK = {
    "UCX_NET_DEVICES": "lo",
    "FI_TCP_IFACE": "lo",
    "FI_SOCKETS_IFACE": "lo",
    "OMPI_MCA_btl": "^tcp",
    "OMPI_MCA_oob_tcp_if_include": "lo",
}


# Set in the ranks an mpiexec of ours starts: srun's variables they may inherit (Hydra starts its
# proxies with srun inside an allocation) do not describe their world.
BY_MPIEXEC = "SWEEPSCALE_MPIEXEC"


def mpiexec_settings(one_host: bool = True) -> dict[str, str]:
    """What an mpiexec's environment needs beyond the caller's. Open MPI's mpirun binds each rank to
    a core unless told not to, and a rank's CPU check (trainer/lifecycle/reference_jobs.py) would inherit that
    one core. On one host: its ranks listen on loopback alone, and MPICH's Hydra forks its proxy
    (inside a Slurm allocation it would start it with srun). As root, Open MPI's consent. (MPICH's
    Hydra still binds its own control port to every address: no option of its binds it to one.)"""
    out = {BY_MPIEXEC: "1", "OMPI_MCA_hwloc_base_binding_policy": "none"}
    if one_host:
        out.update(HYDRA_LAUNCHER="fork", **LOOPBACK)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root without these
        out.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return out


def mpiexec_env() -> dict[str, str]:
    """The environment of a local mpiexec (one host): this process's, with :func:`mpiexec_settings`
    where it does not say otherwise."""
    return {**mpiexec_settings(), **os.environ}


def run_under_mpiexec(mpiexec: str, nproc: int, argv: list[str], module: str = "trainer") -> int:
    """Start ``python -m <module> argv`` on nproc ranks; forward SIGTERM/SIGINT; return its status."""
    cmd = [mpiexec, "-n", str(nproc), sys.executable, "-m", module, *argv]
    proc = subprocess.Popen(cmd, env=mpiexec_env())

    def forward(signum: int, _frame: Any) -> None:
        proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@dataclass
class World:
    comm: Any  # mpi4py.MPI.Comm
    rank: int
    size: int
    local_rank: int
    local_size: int
    library: str

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)


# Open MPI, a process that starts MPI alone (a singleton: no mpiexec, no srun): no daemon for it to
# spawn with and no network transports to probe; 0.3 of Open MPI 4.1's 0.6 s. A setting given wins.
SINGLETON_MCA = {"OMPI_MCA_ess_singleton_isolated": "1", "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "self"}


def join_world(nproc: int) -> World:
    """Initialise MPI and check that the world has exactly nproc ranks."""
    alone = {} if launched_by_mpi() else {k: v for k, v in SINGLETON_MCA.items() if k not in os.environ}
    os.environ.update(alone)
    try:
        from mpi4py import MPI
    finally:  # read by MPI's start only: an mpiexec this process runs later must not pass them on
        for key in alone:
            del os.environ[key]

    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    step_tasks = None if BY_MPIEXEC in os.environ else os.environ.get("SLURM_STEP_NUM_TASKS")
    if step_tasks and int(step_tasks) != size:
        raise ConfigError(
            f"srun started {step_tasks} tasks but MPI sees a world of {size}: srun's PMI plugin does not "
            "match the MPI library; leave launcher.pmi=auto to choose one that does (pmi2 for MPICH, pmix "
            "for Open MPI, or mpiexec inside the allocation)"
        )
    if size != nproc:
        raise ConfigError(
            f"nproc={nproc} but this MPI world has {size} ranks: start it with `mpiexec -n {nproc}` or set nproc={size}"
        )
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    library = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]  # Open MPI's ends in a NUL
    return World(comm, comm.Get_rank(), size, node.Get_rank(), node.Get_size(), library)


WAIT_POLL_S = 0.002
SPIN_S = 0.003  # longer than a poll's sleep: a rank that slept wakes while its peer still spins


def wait_for_all(comm: Any) -> None:
    """Return once every rank of ``comm`` has called this, asleep meanwhile. MPI's blocking calls
    poll a core for as long as they wait (2.0 s of CPU in a 2 s wait, seen with MPICH): between
    points and while rank 0 records, that core is the recording's, the CPU checks' or other runs'.
    Called before a collective whose ranks arrive far apart; the collective then costs nothing."""
    if comm.Get_size() == 1:
        return
    _asleep(comm.Ibarrier())


def share(comm: Any, obj: Any, root: int = 0) -> Any:
    """``comm.bcast(obj)`` of a small object, asleep while it waits. A warm worker's ranks talk so
    between points, where a SIGTERM may end one rank anywhere: a peer waiting in a blocking MPI call
    never runs Python's handler for its own SIGTERM, and waited there for good (a Ctrl-C'd search's
    worker held its sweep's output open past the sweep); asleep, it ends too."""
    if comm.Get_size() == 1:
        return obj
    mine = comm.Get_rank() == root
    data = np.frombuffer(pickle.dumps(obj), np.uint8).copy() if mine else np.empty(0, np.uint8)
    size = np.array([data.size], np.int64)
    _asleep(comm.Ibcast(size, root))
    if not mine:
        data = np.empty(int(size[0]), np.uint8)
    _asleep(comm.Ibcast(data, root))
    return obj if mine else pickle.loads(data.tobytes())


def agree(comm: Any, value: int, op: str) -> int:
    """``comm.allreduce(value)`` with ``op`` "min" or "max", asleep while it waits, as :func:`share`."""
    if comm.Get_size() == 1:
        return value
    from mpi4py import MPI

    buf = np.array([value], np.int64)
    _asleep(comm.Iallreduce(MPI.IN_PLACE, buf, op={"min": MPI.MIN, "max": MPI.MAX}[op]))
    return int(buf[0])


def _asleep(request: Any) -> None:
    """Wait for a nonblocking MPI call, asleep between tests (signal handlers run meanwhile). Tested
    without a pause for its first SPIN_S: ranks in step meet within microseconds, and a first sleep
    would add milliseconds to each exchange."""
    spin_until = time.perf_counter() + SPIN_S
    while not request.Test():
        if time.perf_counter() > spin_until:
            time.sleep(WAIT_POLL_S)
