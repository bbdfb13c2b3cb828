"""How a run's step runs: one frozen value that the run passes to ``step.build`` and records as tags.

The GPU keys (``gpu.*``) say "auto" where the choice depends on what was measured to pay; those
choices, and the resolution of a config into a StepOptions, live in trainer/gpu/policy.py
(``step_options``), once at the top of the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

TENSOR_CORE_GEMMS = ("tf32", "tf32x3", "bf16x3")  # the float32 GEMM modes (``gemm``) on tensor cores
SPLIT_GEMMS = ("tf32x3", "bf16x3")  # float32 accuracy from several tensor-core products
TF32_EXACT_INTEGERS = 2**11  # TF32 holds every integer up to this one (11 significant bits)
BF16_EXACT_INTEGERS = 2**8  # and BF16 up to this one (8)


def gemm_products(gemm: str, dtype: Any, x_levels: int | None) -> int:
    """Products each of the fused step's large GEMMs sums (its operands' parts): 3 for tf32x3 in
    float32, 2 if x_levels says X is exact in TF32 as k = x_levels X; 3 for bf16x3; else 1."""
    if gemm not in SPLIT_GEMMS or np.dtype(dtype) != np.float32:
        return 1
    if gemm == "bf16x3":
        return 3
    return 2 if x_levels is not None and 0 < x_levels <= TF32_EXACT_INTEGERS else 3


@dataclass(frozen=True)
class StepOptions:
    kind: str = "generic"  # generic | fused | auto (fused with CuPy, generic with NumPy)
    gemm: str = "sgemm"  # the fused step's GEMMs: sgemm | tf32 | tf32x3 | bf16x3 | dgemm (gemm_mode)
    overlap: bool = False  # the fused step sums W1's gradient behind its compute (with NCCL only)
    x_levels: int | None = None  # every input is k / x_levels, k an integer (trainer/data.py pixel_levels)
    dtype: str = "float32"
    comm: str = "auto"  # gpu.comm: auto | nccl | mpi
    beside_gemm: bool = False  # NCCL's sums run beside the step's GEMMs (fewer blocks for NCCL)
    nccl_window: bool = False  # NCCL sums the gradient in a symmetric memory window
    profile: bool = False  # NVTX ranges per phase
    graph: bool = False  # the fused step's phases replayed as CUDA graphs (trainer/gpu/graphs.py)

    @property
    def products(self) -> int:
        """Products each model GEMM takes (the fused step's split GEMMs: 2 or 3; else 1)."""
        return gemm_products(self.gemm, self.dtype, self.x_levels) if self.kind == "fused" else 1

    @property
    def arithmetic(self) -> str:
        """The GEMM mode whose peak the run is measured against (trainer/core/flops.py peak_tflops)."""
        if self.kind == "fused":
            return self.gemm
        return "tf32" if self.gemm == "tf32" else self.dtype

    def tags(self, comm: str, overlapped: bool) -> dict[str, str]:
        """The run's tags: ``comm``, the all-reduce's class; ``overlapped``: whether the sums did overlap."""
        tags = {"sweepscale.comm": comm, "sweepscale.step": self.kind}
        if self.kind == "fused":
            tags |= {
                "sweepscale.gemm": self.gemm,
                "sweepscale.gemm_products": str(self.products),
                "sweepscale.overlap": str(overlapped).lower(),
                "sweepscale.graph": str(self.graph).lower(),
            }
        return tags
