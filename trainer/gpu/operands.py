"""The fused step's GEMM operands (GemmOperands, a part of FusedStep): how W1, X and dz1 are laid
out and split into tensor-core parts, X's preparation, and the two large GEMMs.

With tensor cores the fused step keeps z1 transposed, H x B with the batch index contiguous:
z1^T = W1 X^T reads both operands K-major (the summed-over index contiguous in memory), the
fused kernels read and write along samples, the output layer writes a^T = sigmoid(z1 + b1)^T over
z1^T and the hidden gradient dz1^T over a^T; dW1 = dz1^T X then reads dz1^T and X^T (written by
``prepare_x``) K-major too: from row-major operands cuBLAS's TF32 dW1 took 69 us instead of 42 at
H=2048, B=3200 (3xTF32: 190 against 96; H100, benchmarks/gpu_gemm.py). SGEMM and DGEMM keep z1
row-major (B x H), dz1 written over it (each of their kernels computes the sigmoid):
their GEMMs gain nothing from either layout, and their overlapped step (below) was measured
faster with it.

In float32 the large GEMMs run one of four ways (``gemm``):
- ``sgemm``: cuBLAS SGEMM on the CUDA cores (float32 products and sums);
- ``tf32``: TF32 tensor cores (10-bit mantissa inputs, about 1e-3 relative per product);
- ``tf32x3``: float32 accuracy on TF32 tensor cores. Each operand is split into a TF32 high part and a
  TF32 low part (v = hi + lo to about 2^-22 relative), and A B ~ A_lo B_hi + A_hi B_lo + A_hi B_hi
  with float32 accumulation: three tensor-core products, the dropped lo*lo term is ~2^-22. The
  splits ride along kernels that already touch the data (W1 in the update, dz1 in the hidden
  gradient, X in its preparation). Each product stays one GEMM: z1's over K = 3D, the rows
  [W1_hi | W1_lo | W1_hi] against [X_lo | X_hi | X_hi]; dW1's over K = 3n, the transposed
  [dz1_hi | dz1_lo | dz1_hi] against [X_lo | X_hi | X_hi]. In both the small products are
  summed apart from the large ones: with the three parts of a sample side by side, the K-major
  dW1 gradient's error against float64 was 10x SGEMM's, in blocks it is 4-5x
  (test_tf32x3_keeps_float32_accuracy; the trained weights' error equals SGEMM's, docs/benchmarks.md).
  Two products are enough when X is exact in TF32: the trainer's pixels are k / 255 with k a
  byte (``x_levels=255``, trainer/data.py), and an integer below 2^11 is a TF32 value. The
  GEMMs then multiply k itself, [W1_lo | W1_hi] against [k | k] and [dz1_lo | dz1_hi] against
  [k | k] (K = 2D and 2n), and scale by 1/255 through cuBLAS's alpha: a third less tensor-core
  work, and X's and dz1's third parts are never written.
- ``bf16x3`` (the trainer's default): float32 accuracy from three BF16 tensor-core products, for
  inputs whose levels BF16 holds exactly (k <= 256: the pixels). W1 and dz1 are split into
  BF16 parts (a float32's top 16 bits: hi and mid truncated, lo rounded; v = hi + mid + lo to
  about 2^-24), [lo | mid | hi] against [k | k | k], K = 3D and 3n, through cublasGemmEx. BF16
  runs at twice TF32's rate, so three BF16 products take three quarters of two TF32 ones, and
  with 24 bits of W1 and dz1 instead of 22 the gradient is closer to SGEMM's (docs/benchmarks.md).
  Its parts are 16-bit, so dz1's are written to a buffer of their own, not over a^T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.gpu.gemm import leading
from trainer.options import BF16_EXACT_INTEGERS, SPLIT_GEMMS, TENSOR_CORE_GEMMS, gemm_products


@dataclass(frozen=True)
class PreparedX:
    """One batch's X as the tensor-core GEMMs read it, made once for every epoch (FusedStep.prepare):
    x, the batch's rows; xcat and xt, what prepare_x would write for them (views of buffers that
    hold every batch)."""

    x: Any
    xcat: Any
    xt: Any

    def __len__(self) -> int:
        return len(self.x)


class GemmOperands:
    """FusedStep's operand methods: the buffers, the splits and the GEMMs (FusedStep builds the rest)."""

    def _choose_parts(self, gemm: str, dtype: np.dtype, x_levels: int | None) -> None:
        """How the GEMMs' operands are split: split, bf16, blocks, levels and w_lo_at."""
        self.split = gemm in SPLIT_GEMMS and dtype == np.float32
        self.bf16 = gemm == "bf16x3" and dtype == np.float32
        if self.bf16 and not (x_levels and x_levels <= BF16_EXACT_INTEGERS):
            raise ValueError(f"gemm=bf16x3 needs inputs k / x_levels with x_levels <= 256 (got {x_levels}); use tf32x3")
        # Parts per value of the GEMMs' operands (gemm_products): 1 (not split); TF32: 3, or 2 with X
        # as its pixels' integer levels (prepare_x: levels > 0); BF16: 3, X always its levels. W1's
        # and dz1's lo part in block w_lo_at: [hi | lo | hi] against X's [lo | hi | hi], or [lo |
        # hi] against [k | k]; BF16 [lo | mid | hi] against [k | k | k].
        self.blocks = gemm_products(gemm, dtype, x_levels)
        self.levels = dtype.type(x_levels if self.blocks == 2 or self.bf16 else 0)
        self.w_lo_at = 1 if self.blocks == 3 and not self.bf16 else 0
        self.pdtype = np.dtype(np.uint16) if self.bf16 else dtype  # the GEMMs' operands' storage: BF16 as uint16

    def _allocate(self, gemm: str, dtype: np.dtype, max_rows: int) -> None:
        """z1 (transposed with tensor cores), dz1, X^T, e, and the GEMMs' operands as parts."""
        cp, pdtype = self.cp, self.pdtype
        D, H, C = self.layout.D, self.layout.H, self.layout.C
        # With tensor cores z1 is kept transposed, z (H x ld): z1^T = W1 X^T reads both operands
        # K-major (the summed-over index contiguous), as fast as z1 = X W1^T, and the *_t kernels read
        # and write along samples. a^T, then dz1^T, are written over it (split, its three TF32 parts in three
        # column blocks, each ``part`` wide) and dW1 = dz1^T X reads it and X^T (xt: D x ld, by
        # prepare_x; split, X's parts in three blocks) K-major: from row-major dz1 and X cuBLAS's TF32
        # GEMM is 1.6x slower. A batch's samples are padded with zeros to whole tiles of 32
        # (``padded``: prepare_x's tile, whole Vs in the kernels). SGEMM and DGEMM keep z1 row-major
        # (z1: max_rows x H, dz1 over it): their GEMMs gain nothing from the layouts, and with z1^T the
        # overlapped SGEMM step at 4 GPUs took 0.675 ms instead of 0.619 (0.616 at best, tuned;
        # docs/benchmarks.md).
        self.transposed = gemm in TENSOR_CORE_GEMMS and dtype == np.float32
        if self.transposed:
            width = self.blocks * self.padded(max_rows)  # dz1^T's and xt's columns: parts side by side
            self.ld = self.padded(max_rows) if self.bf16 else width
            self.z = cp.zeros((H, self.ld), dtype=dtype)  # z1^T, then a^T, then dz1^T (BF16: its parts in dz)
            self.dz = cp.zeros((H, width), dtype=pdtype) if self.bf16 else self.z
            self.xt = cp.zeros((D, width), dtype=pdtype)
            self.e = cp.empty((C, self.padded(max_rows)), dtype=dtype)  # (softmax(z2) - onehot(y))^T
        else:
            self.z = self.dz = cp.empty((max_rows, H), dtype=dtype)  # z1, then dz1
            self.xt = None  # the GEMMs read X as it is
            self.e = cp.empty((max_rows, C), dtype=dtype)  # softmax(z2) - onehot(y)
        if self.split:
            # The GEMMs' operands as parts. In z1's, small products first (summed first, they lose less).
            self.xcat = cp.empty((max_rows, self.blocks * D), dtype=pdtype)  # [X_lo | X_hi | X_hi] or [k | k ...]
            self.w1cat = cp.empty((H, self.blocks * D), dtype=pdtype)  # [W1_hi | W1_lo | W1_hi], [W1_lo | W1_hi] ...
            self._split(self.p.W1, self.w1cat)  # kept by update()
        else:
            self.xcat = self.w1cat = cp.empty(1, dtype=dtype)  # unused kernel arguments

    def _split(self, a: Any, out: Any) -> None:
        rows, d = a.shape
        grid = min(-(-a.size // self.THREADS), 1024)
        args = (a, np.int32(rows), np.int32(d), np.int32(self.blocks), np.int32(self.w_lo_at), out)
        self._kernel["split_tf32"]((grid,), (self.THREADS,), args)

    @staticmethod
    def padded(n: int) -> int:
        """n samples to whole tiles of 32: the columns of z1^T (and xt) that a batch of n fills."""
        return 32 * -(-n // 32)

    def prepare_x(self, x: Any, xcat: Any = None, xt: Any = None) -> None:
        """X^T into xt; split, X's TF32 parts (or its integer levels) into xcat (for z1) and xt (for
        dW1). By default into the step's own buffers, for this step's batch."""
        xcat, xt = (self.xcat, self.xt) if xt is None else (xcat, xt)
        (n, D), part = x.shape, self.padded(len(x))
        self._kernel["prepare_x"](
            (-(-D // 32), part // 32), (32, 8),
            (x, np.int32(n), np.int32(D), np.int32(self.blocks), self.levels, xcat, xt, np.int32(leading(xt)),
             np.int32(part)),
        )  # fmt: skip

    def prepare(self, x: Any, rows: list[tuple[int, int]]) -> list[PreparedX] | None:
        """Every batch's X (rows [lo, hi) of x, on the device) prepared for the tensor-core GEMMs
        at once, for runs whose batches are the same every epoch (no shuffling): given one of
        these, forward skips prepare_x (8 to 28 us a step at H=2048, B=3200; docs/benchmarks.md). Costs
        the memory of X once (TF32), three times (bf16x3: xcat and xt, three 16-bit parts each)
        or four (two TF32 parts each; three: six).
        None where there is nothing to prepare (SGEMM, DGEMM) or no memory for it."""
        if not self.transposed:
            return None
        cp, D, dtype = self.cp, self.layout.D, self.xt.dtype
        sizes = [hi - lo for lo, hi in rows]
        cols = [self.blocks * self.padded(n) for n in sizes]
        try:
            xt_all = cp.empty((D, sum(cols)), dtype=dtype)
            xcat_all = cp.empty((sum(sizes), self.blocks * D), dtype=dtype) if self.split else self.xcat
        except cp.cuda.memory.OutOfMemoryError:
            return None
        batches, c0, r0 = [], 0, 0
        for (lo, hi), n, c in zip(rows, sizes, cols):
            xb, xt = x[lo:hi], xt_all[:, c0 : c0 + c]
            xcat = xcat_all[r0 : r0 + n] if self.split else xcat_all
            if n:
                self.prepare_x(xb, xcat, xt)
            batches.append(PreparedX(xb, xcat, xt))
            c0, r0 = c0 + c, r0 + n
        return batches

    def _operands(self, x: Any) -> tuple[Any, Any, Any]:
        """A batch's rows of X, xcat and xt: a PreparedX's, or x and the step's buffers."""
        if isinstance(x, PreparedX):
            return x.x, x.xcat, x.xt
        return x, self.xcat, self.xt

    def z1_gemm(self, x: Any, part: int = 0) -> None:
        """z1 for the rows of W1 in ``part`` (all of them without overlap): z1^T = W1 X^T
        (transposed; split: W1_hi X_lo^T + W1_lo X_hi^T + W1_hi X_hi^T, one GEMM with K = 3D, or
        with X's levels k (W1_lo k^T + W1_hi k^T) / 255, K = 2D) or z1 = X W1^T."""
        rows, xcat, _ = self._operands(x)
        n = len(rows)
        if self.transposed:
            xs = xcat[:n] if self.split else rows
            self.gemm(self.w1_part[part], xs, self.z1_part[part][:, :n], tb=True, alpha=self.alpha)
        else:
            self.gemm(rows, self.w1_part[part], self.z1_part[part][:n], tb=True)

    def dw1_gemm(self, x: Any, part: int = 0) -> None:
        """dW1 = dz1^T X, the rows of dW1's ``part``-th GEMM (all of them, or with overlap and
        SGEMM W1's rows in that part). Transposed: dz1^T xt^T over the padded samples (zeros past
        n); split, over three blocks of them, dz1_hi X_lo, dz1_lo X_hi and dz1_hi X_hi (or two,
        dz1_lo k and dz1_hi k, scaled by 1/255): the products summed in one pass."""
        rows, _, xt = self._operands(x)
        if not self.transposed:
            self.gemm(self.dz1_part[part][: len(rows)], rows, self.gw1_part[part], ta=True)
            return
        k = self.blocks * self.padded(len(rows))
        self.gemm(self.dz1_part[part][:, :k], xt[:, :k], self.gw1_part[part], tb=True, alpha=self.alpha)
