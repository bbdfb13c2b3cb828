"""The one home of every "auto = where it was measured to pay" choice of the GPU path.

Each choice keeps one line of its measurement here; the tables and their commands are in
docs/benchmarks.md. Pure Python: importing it needs no CuPy.
"""

from __future__ import annotations

import os
from typing import Any

from trainer.data import pixel_levels
from trainer.errors import ConfigError
from trainer.options import TENSOR_CORE_GEMMS, StepOptions

# CuPy reads it once, at its first matmul: a process runs one GEMM mode (gpu.gemm=tf32 sets it).
TF32_ENV = "CUPY_TF32"
GPU_ONLY = {"step": "fused", "comm": "nccl"}  # gpu.<key> values that need a GPU

# NCCL's blocks beside the step's GEMMs: 8 beat NCCL's default (docs/benchmarks.md, Scaling with NCCL).
OVERLAP_MAX_CTAS = 8
# Symmetric kernel's blocks: 32 summed 6.5 MB in 30/42 us at 2/4 H200s, NCCL's 7 in 35/45 (docs/benchmarks.md).
WINDOW_CTAS = 32
# Paid only with SGEMM at H=2048 (0.615 vs 0.637 ms, 4 H200s): docs/benchmarks.md, Scaling with NCCL.
OVERLAP_PAYS = frozenset({("sgemm", 2048)})  # (GEMM mode, hidden)


def sums_beside_gemm(gemm: str) -> bool:
    """With overlap, whether NCCL's sums run beside a long GEMM: with SGEMM (and DGEMM), the
    first part's beside the second part's dW1. With tensor cores dW1 is one GEMM and both sums
    follow it, mostly exposed: NCCL then needs all its blocks (trainer/ranks/allreduce.py make_allreduce)."""
    return gemm not in TENSOR_CORE_GEMMS


def overlap_wanted(overlap: str, step: str, nproc: int, gemm: str, hidden: int) -> bool:
    """Whether the fused step should sum W1's gradient in halves behind its compute (with NCCL):
    ``overlap`` (gpu.overlap) auto does where it was measured to pay (OVERLAP_PAYS)."""
    if step != "fused" or nproc == 1 or overlap == "never":
        return False
    return overlap == "always" or (gemm, hidden) in OVERLAP_PAYS


# Paid (TF32, 4 GPUs: 0.202 vs 0.212 ms) but beside SGEMMs (0.634 vs 0.614): docs/benchmarks.md, the same section.
def window_wanted(nccl_window: str, beside_gemm: bool) -> bool:
    """Whether NCCL sums the gradient in a symmetric memory window (trainer/gpu/nccl.py):
    ``nccl_window`` (gpu.nccl_window) auto, always or never; auto leaves out sums beside SGEMMs."""
    return nccl_window == "always" or (nccl_window == "auto" and not beside_gemm)


def graph_wanted(graph: str, step: str, overlap: bool, shuffle: bool, on_device: bool) -> bool:
    """Whether the fused step's phases replay as CUDA graphs (trainer/gpu/graphs.py): ``graph``
    (gpu.graph) auto does wherever each batch's operands stay put: the fused step, its sums not
    overlapped, the batches in order on the device (X prepared once). Measured: docs/benchmarks.md,
    The step's launches."""
    return graph == "auto" and step == "fused" and not overlap and not shuffle and on_device


def gemm_mode(cfg: Any) -> str:
    """How the fused step's GEMMs run: gpu.gemm in float32, DGEMM in float64."""
    if cfg.dtype.value != "float32":
        return "dgemm"  # float64: whatever gpu.gemm says
    return cfg.gpu.gemm.value


def step_options(cfg: Any, backend_kind: str) -> StepOptions:
    """The run's StepOptions from its config and the backend's kind (cpu or gpu): every "auto" of
    ``gpu.*`` decided here, once."""
    gpu = cfg.gpu
    kind = gpu.step.value if gpu.step.value != "auto" else ("fused" if backend_kind == "gpu" else "generic")
    gemm, x_levels = gemm_mode(cfg), pixel_levels(cfg.data.scale.value)
    overlap = overlap_wanted(gpu.overlap.value, kind, cfg.nproc, gemm, cfg.hidden)
    beside_gemm = overlap and sums_beside_gemm(gemm)
    return StepOptions(
        kind=kind,
        gemm=gemm,
        overlap=overlap,
        x_levels=x_levels,
        dtype=cfg.dtype.value,
        comm=gpu.comm.value,
        beside_gemm=beside_gemm,
        nccl_window=window_wanted(gpu.nccl_window.value, beside_gemm),
        profile=gpu.profile,
        graph=graph_wanted(gpu.graph.value, kind, overlap, cfg.data.shuffle, cfg.data.on_device),
    )


def tf32_env(gemm: str) -> dict[str, str]:
    """The environment a process of this gpu.gemm starts with (its ranks and warm workers too)."""
    return {TF32_ENV: "1"} if gemm == "tf32" else {}


def tf32_here() -> bool:
    """Whether this process's CuPy runs its float32 matmuls as TF32."""
    return os.environ.get(TF32_ENV) == "1"


def check_gpu_keys(cfg: Any, gpu_used: bool) -> None:
    """Refuse gpu.* values that need a GPU where none is used, before any rank starts."""
    if gpu_used:
        return
    for key, gpu_only in GPU_ONLY.items():
        if cfg.gpu[key].value == gpu_only:
            raise ConfigError(f"gpu.{key}={gpu_only} needs a GPU and none is used here; set gpu.{key}=auto")
