"""The one home of every "auto = where it was measured to pay" choice of the GPU path.

Each choice keeps one line of its measurement here; the tables and their commands are in
docs/benchmarks.md. Pure Python: importing it needs no CuPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TENSOR_CORE_GEMMS = ("tf32", "tf32x3", "bf16x3")  # the float32 GEMM modes (``gemm``) on tensor cores
SPLIT_GEMMS = ("tf32x3", "bf16x3")  # float32 accuracy from several tensor-core products
TF32_EXACT_INTEGERS = 2**11  # TF32 holds every integer up to this one (11 significant bits)
BF16_EXACT_INTEGERS = 2**8  # and BF16 up to this one (8)

# NCCL's blocks beside the step's GEMMs: 8 beat NCCL's default (docs/benchmarks.md, A GEMM beside the all-reduce).
OVERLAP_MAX_CTAS = 8
# Symmetric kernel's blocks: 32 summed 6.5 MB in 30/42 us at 2/4 H200s, NCCL's 7 in 35/45 (docs/benchmarks.md).
WINDOW_CTAS = 32
# Paid only with SGEMM at H=2048 (0.615 vs 0.637 ms, 4 H200s): docs/benchmarks.md, The overlap's sizes.
OVERLAP_PAYS = frozenset({("sgemm", 2048)})  # (GEMM mode, hidden)


def gemm_products(gemm: str, dtype: Any, x_levels: int | None) -> int:
    """Products each of the fused step's large GEMMs sums (its operands' parts): 3 for tf32x3 in
    float32, 2 if x_levels says X is exact in TF32 as k = x_levels X; 3 for bf16x3; else 1."""
    if gemm not in SPLIT_GEMMS or np.dtype(dtype) != np.float32:
        return 1
    if gemm == "bf16x3":
        return 3
    return 2 if x_levels is not None and 0 < x_levels <= TF32_EXACT_INTEGERS else 3


def sums_beside_gemm(gemm: str) -> bool:
    """With overlap, whether NCCL's sums run beside a long GEMM: with SGEMM (and DGEMM), the
    first part's beside the second part's dW1. With tensor cores dW1 is one GEMM and both sums
    follow it, mostly exposed: NCCL then needs all its blocks (parallel.make_allreduce)."""
    return gemm not in TENSOR_CORE_GEMMS


def overlap_wanted(overlap: str, step: str, nproc: int, gemm: str, hidden: int) -> bool:
    """Whether the fused step should sum W1's gradient in halves behind its compute (with NCCL):
    ``overlap`` (gpu.overlap) auto does where it was measured to pay (OVERLAP_PAYS)."""
    if step != "fused" or nproc == 1 or overlap == "never":
        return False
    return overlap == "always" or (gemm, hidden) in OVERLAP_PAYS


# Paid (TF32, 4 GPUs: 0.202 vs 0.212 ms) but beside SGEMMs (0.634 vs 0.614): docs/benchmarks.md, NCCL's window.
def window_wanted(nccl_window: str, beside_gemm: bool) -> bool:
    """Whether NCCL sums the gradient in a symmetric memory window (trainer/gpu/nccl.py):
    ``nccl_window`` (gpu.nccl_window) auto, always or never; auto leaves out sums beside SGEMMs."""
    return nccl_window == "always" or (nccl_window == "auto" and not beside_gemm)
