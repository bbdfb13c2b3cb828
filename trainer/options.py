"""How a run's step runs, resolved once at the top of the run from the config and the backend.

The GPU keys (``gpu.*``) say "auto" where the choice depends on what was measured to pay; those
choices live in trainer/gpu/policy.py. A StepOptions is the result: one frozen value that the run
passes to ``fit`` and ``make_step`` and records as tags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer.data import pixel_levels
from trainer.gpu import policy


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

    @classmethod
    def resolve(cls, cfg: Any, backend_kind: str) -> StepOptions:
        """From the config and the backend's kind (cpu or gpu); gemm_mode is computed here, once."""
        gpu = cfg.gpu
        kind = gpu.step.value if gpu.step.value != "auto" else ("fused" if backend_kind == "gpu" else "generic")
        gemm = gemm_mode(cfg)
        overlap = policy.overlap_wanted(gpu.overlap.value, kind, cfg.nproc, gemm, cfg.hidden)
        beside_gemm = overlap and policy.sums_beside_gemm(gemm)
        return cls(
            kind=kind,
            gemm=gemm,
            overlap=overlap,
            x_levels=pixel_levels(cfg.data.scale.value),
            dtype=cfg.dtype.value,
            comm=gpu.comm.value,
            beside_gemm=beside_gemm,
            nccl_window=policy.window_wanted(gpu.nccl_window.value, beside_gemm),
            profile=gpu.profile,
        )

    @property
    def products(self) -> int:
        """Products each model GEMM takes (the fused step's split GEMMs: 2 or 3; else 1)."""
        return policy.gemm_products(self.gemm, self.dtype, self.x_levels) if self.kind == "fused" else 1

    @property
    def arithmetic(self) -> str:
        """The GEMM mode whose peak the run is measured against (trainer/flops.py peak_tflops)."""
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
            }
        return tags


def gemm_mode(cfg: Any) -> str:
    """How the fused step's GEMMs run: gpu.gemm in float32, DGEMM in float64."""
    if cfg.dtype.value != "float32":
        return "dgemm"  # float64: whatever gpu.gemm says
    return cfg.gpu.gemm.value
