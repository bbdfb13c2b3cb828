"""The array module a run computes with: NumPy on the CPU or CuPy on one GPU per rank."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainer.errors import ConfigError


@dataclass
class Backend:
    xp: Any
    kind: str  # "cpu" or "gpu"
    device_name: str
    versions: dict[str, str] = field(default_factory=dict)
    n_devices: int = 0  # GPUs visible to this process
    device_index: str = ""  # the machine's number of this rank's GPU (CUDA_VISIBLE_DEVICES maps it)
    blas_threads: int = 0  # a CPU rank's BLAS threads (share_cores)

    def describe(self) -> str:
        """This rank's device as a run records it: ``gpu3 (NVIDIA H100 80GB HBM3)`` or ``cpu``."""
        return f"gpu{self.device_index} ({self.device_name})" if self.kind == "gpu" else "cpu"

    def to_host(self, a: Any) -> np.ndarray:
        return a.get() if self.kind == "gpu" else np.asarray(a)


def gpu_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, or no device: all mean "no GPU here"
        return 0


def visible_gpus() -> int:
    """:func:`gpu_count` without importing CuPy or starting CUDA (half a second a process): the GPUs
    the NVIDIA driver lists (/proc/driver/nvidia/gpus), as many as CUDA_VISIBLE_DEVICES names, and
    none where CuPy is not installed; where the driver lists nothing, CuPy is asked."""
    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        return 0
    listed = Path("/proc/driver/nvidia/gpus")
    if not listed.is_dir():
        return gpu_count()
    n = sum(1 for _ in listed.iterdir())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return n if visible is None else min(n, len([v for v in visible.split(",") if v.strip() not in ("", "-1")]))


BLAS_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def blas_threads(threads: int) -> dict[str, str]:
    """The environment that gives each CPU rank ``threads`` BLAS and OpenMP threads (a runner's say)."""
    return {key: str(threads) for key in BLAS_THREADS}


def usable_cores() -> int:
    """The cores this process may run on (its affinity: mpiexec's, Slurm's or a cgroup's; macOS: all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def share_cores(ranks_here: int) -> int:
    """This CPU rank's BLAS threads: its share of the cores it may use among the ``ranks_here`` ranks
    of its host, unless the environment sets them (a runner's, or the user's). Left to itself, each
    rank starts a thread per core and their threads spin waiting for each other: ``python -m trainer
    nproc=2`` on 2 cores took 16 ms a batch, 0.6 ms with a thread a rank. Returns the threads."""
    from threadpoolctl import ThreadpoolController

    blas = ThreadpoolController().select(user_api="blas")
    if ranks_here > 1 and not any(key in os.environ for key in BLAS_THREADS):
        blas.limit(limits=max(1, usable_cores() // ranks_here))  # kept: no restore
        blas = ThreadpoolController().select(user_api="blas")
    return max((pool["num_threads"] for pool in blas.info()), default=1)


def no_gpu() -> ConfigError:
    """device=gpu where no GPU is usable: what to do about it."""
    return ConfigError(
        "device=gpu but no GPU is usable here (CuPy missing or no CUDA device): install the "
        "`cuda12` or `cuda13` extra on a GPU machine, or set device=cpu (or auto)"
    )


def select(device: str, local_rank: int, local_size: int = 1) -> Backend:
    """NumPy (its BLAS threads this rank's share of the cores of its host's ``local_size`` ranks), or
    CuPy on GPU ``local_rank mod count`` (one GPU per rank on each node). ``device``: auto, cpu or
    gpu (config ``device``, a str enum)."""
    n_gpus = 0 if device == "cpu" else gpu_count()
    if device == "gpu" and n_gpus == 0:
        raise no_gpu()
    if n_gpus == 0:
        name, versions = platform.processor() or platform.machine(), {"numpy": np.__version__}
        return Backend(np, "cpu", name, versions, blas_threads=share_cores(local_size))
    import cupy

    dev = cupy.cuda.Device(local_rank % n_gpus)  # one GPU per rank of a node, as Slurm or the runner lists them
    dev.use()
    bind_near(cupy.cuda.runtime.deviceGetPCIBusId(dev.id))
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    versions = {
        "numpy": np.__version__,
        "cupy": cupy.__version__,
        "cuda_runtime": str(cupy.cuda.runtime.runtimeGetVersion()),
        "cuda_driver": str(cupy.cuda.runtime.driverGetVersion()),
    }
    return Backend(cupy, "gpu", name, versions, n_gpus, visible[dev.id] if dev.id < len(visible) else str(dev.id))


def cpu_list(text: str) -> set[int]:
    """Linux's CPU list format ("0-15,32-47") as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def bind_near(pci_bus_id: str) -> set[int] | None:
    """Bind this process to the cores nearest its GPU (the GPU's NUMA node, from sysfs), within the
    cores it may use (mpiexec's or Slurm's binding, a cgroup): its launches then cross no socket.
    Returns the cores bound to; None where Linux does not say which are near, or none of them is allowed."""
    try:
        near = cpu_list(Path(f"/sys/bus/pci/devices/{pci_bus_id.lower()}/local_cpulist").read_text())
        allowed = os.sched_getaffinity(0)
    except (OSError, ValueError, AttributeError):
        return None
    cores = near & allowed
    if not cores or cores == allowed:
        return None
    os.sched_setaffinity(0, cores)
    return cores


def pinned(a: np.ndarray) -> Any:
    """A copy of ``a`` in page-locked host memory (the course's host-to-device path)."""
    import cupyx

    out = cupyx.empty_pinned(a.shape, dtype=a.dtype)
    out[...] = a
    return out
