"""FusedStep (CuPy only): the step of trainer/step.py's GenericStep, in the loop's same phases, with
the two large GEMMs (z1 and dW1 = dz1^T X) straight through cuBLAS (gemm.py), and everything else in
fused kernels (kernels.cu) that each pass over the B x H activations at most once: the output layer
(sigmoid, the 10-wide second layer, softmax, loss), the hidden gradient (dz1, dW2, db1, db2) and the
SGD+L2 update; with tensor cores also X's preparation for the GEMMs, which ``prepare`` does once for
the whole run when the batches are the same every epoch (trainer/core/loop.py, no shuffling). No host
synchronisation anywhere in the step. How the GEMMs' operands are laid out and split (the GEMM
modes sgemm, tf32, tf32x3, bf16x3) is in operands.py.

With NCCL the fused step can hide the all-reduce behind its own compute (``overlap``): W1's rows
are taken in two halves. With SGEMM the sum of the first half's dW1 runs on a side stream while
the second half's dW1 is computed; with tensor cores dW1 stays one GEMM (halved, its GEMMs
run too few tiles) and both sums follow it. The update waits for them in the next forward: the
first half's sum runs beside the next batch's X preparation (tensor cores), the second half's
(with db1, dW2, db2 and the loss) while the first half of W1 is updated and the next batch's
first half of z1^T = W1 X^T is computed. So an update is done by the next forward (or by
``finish``, before anyone reads the weights), and the step's "allreduce" and "update" phases
are empty.

Every step has the same five calls, which trainer/core/loop.py makes in order: forward, backward (or
zero_gradient for a rank without rows), reduce, update, and finish at the end of an epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainer.core import model
from trainer.gpu.gemm import Gemm, leading
from trainer.gpu.operands import GemmOperands, PreparedX
from trainer.gpu.policy import sums_beside_gemm
from trainer.options import TENSOR_CORE_GEMMS

if TYPE_CHECKING:
    from trainer.options import StepOptions

KERNELS_CU = Path(__file__).with_name("kernels.cu")  # the CUDA source, after FusedStep's typedefs and defines


class FusedStep(GemmOperands):
    """The same step in 2 cuBLAS GEMMs, 3 fused kernels (4 with tensor cores: X's preparation, unless
    ``prepare`` made it once) and a memset."""

    KERNELS = KERNELS_CU.read_text()  # a class attribute, so benchmarks/gpu_kernels.py can time variants
    # Block shapes: the fastest measured (benchmarks/gpu_kernels.py, docs/benchmarks.md; OUT_UNROLL and
    # OUT_PREFETCH in the whole step, where z1^T comes partly from memory: 4 rows at once, 3 us a
    # step less than 2; prefetched 16 rows ahead, 4 us less than not).
    THREADS = 256  # the one-dimensional kernels' (split_tf32, sgd_update, the *_rows kernels)
    OUT_ROWS, HID_ROWS = 1, 16  # z1 row-major: rows per block of output_layer_rows, hidden_grad_rows
    # z1 transposed (tensor cores): output_layer_t's warps per block of 32 samples (float64: half, for
    # its shared memory) and rows a warp loads at once; hidden_grad_t's warps, hidden units and
    # samples / (32 VEC) per block, and its blocks per SM (registers capped at 64; float64: half).
    OUT_WARPS, OUT_UNROLL = 32, 4
    OUT_SAMPLES = 32  # output_layer_t's samples per block: 32, or 16 (two rows a warp)
    OUT_PREFETCH = 16  # output_layer_t's rows (of a lane's) between a prefetch into L2 and the load: 0, none
    HID_WARPS, HID_H, HID_ITER = 8, 32, 4
    HID_MIN_BLOCKS = 4
    FIRST_PART = 0.5  # with overlap, the fraction of W1's rows summed first: the best measured

    def __init__(self, layout: model.Layout, params: Any, gbuf: Any, max_rows: int, options: StepOptions,
                 allreduce: Any = None) -> None:  # fmt: skip
        """``options``: the GEMM mode, the overlap and the inputs' levels (trainer/options.py)."""
        import cupy as cp

        gemm, overlap, x_levels = options.gemm, options.overlap, options.x_levels

        self.cp, self.layout = cp, layout
        self.p, self.g, self.gbuf = layout.views(params), layout.views(gbuf[:-1]), gbuf
        self.params = params
        dtype = np.dtype(params.dtype)
        self._choose_parts(gemm, dtype, x_levels)
        self._compile(dtype)
        self.gemm = Gemm(dtype, tensor_cores=gemm in TENSOR_CORE_GEMMS, bf16=self.bf16)
        self.alpha = 1 / self.levels if self.levels else 1  # the GEMMs' scale, with X as its levels
        self._keep_weights(gbuf, dtype)
        self._allocate(gemm, dtype, max_rows)
        self._plan_parts(gemm, dtype, allreduce, overlap)

    def _compile(self, dtype: np.dtype) -> None:
        """kernels.cu after the types and block shapes it is written for (its first comment)."""
        layout = self.layout
        ctype, vtype = {np.dtype(np.float32): ("float", "float4"), np.dtype(np.float64): ("double", "double2")}[dtype]
        vec = 16 // dtype.itemsize
        self.hw_len = hw_len = -(-(layout.C + 1) // vec) * vec
        self.hid_s = 32 * vec * self.HID_ITER  # samples per block of hidden_grad
        self.out_warps = self.OUT_WARPS * 4 // dtype.itemsize
        defines = {"VEC": vec, "C": layout.C, "HW": hw_len, "THREADS": self.THREADS, "OUT_ROWS": self.OUT_ROWS}
        defines |= {"HID_ROWS": self.HID_ROWS, "OUT_WARPS": self.out_warps, "OUT_UNROLL": self.OUT_UNROLL}
        defines |= {"HID_WARPS": self.HID_WARPS, "HID_H": self.HID_H, "HID_S": self.hid_s}
        defines |= {"OUT_S": self.OUT_SAMPLES, "OUT_PREFETCH": self.OUT_PREFETCH}
        defines |= {"HID_MIN_BLOCKS": self.HID_MIN_BLOCKS * 4 // dtype.itemsize}
        defines |= {"BF16": int(self.bf16)}
        head = f"typedef {ctype} T;\ntypedef {vtype} V;\ntypedef {'unsigned short' if self.bf16 else 'T'} P;\n"
        head += "".join(f"#define {k} {v}\n" for k, v in defines.items())
        module = self.cp.RawModule(code=head + "\n" + self.KERNELS)  # the source exactly as before the move
        names = ("split_tf32", "prepare_x", "output_layer_rows", "hidden_grad_rows", "output_layer_t", "hidden_grad_t")
        names += ("sgd_update",)
        self._kernel = {name: module.get_function(name) for name in names}

    def _keep_weights(self, gbuf: Any, dtype: np.dtype) -> None:
        """hw (W2^T and b1 as the kernels read them), the gradient's tail and the weights' bounds."""
        cp, layout = self.cp, self.layout
        D, H, C = layout.D, layout.H, layout.C
        # Row h: W2[:, h], b1[h], zeros; kept by update(). The kernels read each row in 16-byte loads.
        self.hw = cp.zeros((H, self.hw_len), dtype=dtype)
        self.hw[:, :C], self.hw[:, C] = self.p.W2.T, self.p.b1
        self.tail = gbuf[H * D :]  # db1, dW2, db2, loss: sums of atomics, zeroed each step
        self.ce_sum = gbuf[-1:]
        self.scalar = dtype.type
        w1_end, w2_begin = H * D, H * D + H  # weights: [0, w1_end) and [w2_begin, w2_end)
        self.bounds = tuple(np.int64(v) for v in (w1_end, w2_begin, w2_begin + C * H))

    def _plan_parts(self, gemm: str, dtype: np.dtype, allreduce: Any, overlap: bool) -> None:
        """The all-reduce, and the views of W1's rows that each GEMM, sum and update takes."""
        cp, layout, H, D = self.cp, self.layout, self.layout.H, self.layout.D
        # The all-reduce, and with overlap W1's rows in two parts, each summed as soon as its dW1 is
        # computed: part 0 = gbuf[:cut] (dW1's first rows), part 1 = the rest (with b1, W2, b2, loss).
        gbuf = self.gbuf
        self.allreduce = allreduce
        self.overlap = overlap and allreduce is not None and allreduce.overlaps  # NcclAllreduce can
        # The cut on a multiple of 32 rows: row-major z1's column slices then start on a 128-byte
        # boundary (a cut at row 819 of 2048 made the step 1.24x as long as one at row 768, docs/benchmarks.md).
        h0 = min(H, max(32, 32 * round(self.FIRST_PART * H / 32))) if self.overlap else H
        rows = [(0, h0), (h0, H)] if self.overlap else [(0, H)]
        # dW1 per part with SGEMM (the first part's sum runs beside the second's GEMM); whole with
        # tensor cores (halved, their GEMMs run too few tiles), both sums after it.
        per_part = dtype != np.float32 or sums_beside_gemm(gemm)
        dw1_rows = rows if per_part else [(0, H)]
        self.sums_after = [[0], [1]] if per_part else [[0, 1]]
        self.cut = h0 * D
        self.parts = (gbuf[: self.cut], gbuf[self.cut :]) if self.overlap else ()
        self.summed = [cp.cuda.Event(disable_timing=True) for _ in self.parts]  # recorded by NCCL's stream
        self.pending: tuple[Any, ...] | None = None  # the last update, left to the next forward (overlap)
        # The GEMMs' operands per part of W1's rows, as views made once: a CuPy view costs a few
        # us of CPU, which a step launch-bound at small H cannot spare.
        w1 = self.w1cat if self.split else self.p.W1
        self.w1_part = [w1[lo:hi] for lo, hi in rows]

        def of_rows(z: Any, lo: int, hi: int) -> Any:  # z1 (or dz1) of W1's rows [lo, hi)
            return z[lo:hi] if self.transposed else z[:, lo:hi]

        self.z1_part = [of_rows(self.z, lo, hi) for lo, hi in rows]
        self.gw1_part = [self.g.W1[lo:hi] for lo, hi in dw1_rows]
        self.dz1_part = [of_rows(self.dz, lo, hi) for lo, hi in dw1_rows]
        # sgd_update's launch per range of the parameters: all, or with overlap [0, cut) and the rest.
        sm = cp.cuda.Device().attributes["MultiProcessorCount"]
        ranges = [(0, self.cut), (self.cut, layout.size)] if self.overlap else [(0, layout.size)]
        self.update_ranges = [(min(-(-(b - a) // self.THREADS), 8 * sm), np.int64(a), np.int64(b)) for a, b in ranges]

    def forward(self, x: Any, y: Any) -> None:
        """x: the batch's rows of X, or their PreparedX."""
        cp = self.cp
        if self.transposed and not isinstance(x, PreparedX):
            self.prepare_x(x)  # with overlap: beside the sum of the last gradient's first part
        self._finish_update(0)  # with overlap: W1's first rows, once their sum is in
        self.z1_gemm(x, 0)
        self._finish_update(1)  # with overlap: the rest of W1, b1, W2, b2, once their sum is in
        cp.cuda.runtime.memsetAsync(self.tail.data.ptr, 0, self.tail.nbytes, cp.cuda.get_current_stream().ptr)
        if self.overlap:
            self.z1_gemm(x, 1)
        self.output_layer(y)

    def backward(self, x: Any, y: Any, scale: float) -> None:
        self.hidden_gradient(len(x), scale)
        for i in range(len(self.dz1_part)):
            self.dw1_gemm(x, i)
            for j in self.sums_after[i] if self.overlap else ():  # on NCCL's stream, beside what follows
                self.allreduce.start(self.parts[j], self.summed[j])

    def zero_gradient(self) -> None:
        """Instead of forward and backward when this rank has no rows of the batch; with
        overlap it still starts the same sums as the other ranks."""
        self.finish()
        self.gbuf.fill(0)
        for part, done in zip(self.parts, self.summed):  # none without overlap
            self.allreduce.start(part, done)

    def reduce(self) -> None:
        """Sum the gradient over the ranks. With overlap the sums are under way on NCCL's stream
        already: the next forward (or ``finish``) waits for each part where it needs it."""
        if self.allreduce is not None and not self.overlap:
            self.allreduce(self.gbuf)

    def output_layer(self, y: Any) -> None:
        """From z1's first len(y) samples: e = softmax(z2) - onehot(y) (transposed with z1) and the
        summed cross-entropy into gbuf[-1]."""
        n, H = len(y), self.layout.H
        if self.transposed:
            self._kernel["output_layer_t"](
                (self.padded(n) // self.OUT_SAMPLES,), (32, self.out_warps),
                (self.z, np.int32(self.ld), self.hw, self.p.b2, y, np.int32(n), np.int32(H), self.e,
                 np.int32(self.e.shape[1]), self.ce_sum),
            )  # fmt: skip
        else:
            self._kernel["output_layer_rows"](
                (-(-n // self.OUT_ROWS),), (self.THREADS,),
                (self.z, self.hw, self.p.b2, y, np.int32(n), np.int32(H), self.e, self.ce_sum),
            )  # fmt: skip

    def hidden_gradient(self, n: int, scale: float) -> None:
        """dz1 over z1 (transposed: dz1^T, split as TF32 parts); dW2, db1 and db2 added to the gradient."""
        g, H = self.g, self.layout.H
        if self.transposed:
            part = self.padded(n)
            self._kernel["hidden_grad_t"](
                (-(-H // self.HID_H), -(-part // self.hid_s)), (32, self.HID_WARPS),
                (self.z, np.int32(self.ld), self.hw, self.e, np.int32(self.e.shape[1]), np.int32(n), np.int32(H),
                 self.scalar(scale), np.int32(self.blocks), np.int32(self.w_lo_at), np.int32(part), self.dz,
                 np.int32(leading(self.dz)), g.b1, g.W2, g.b2),
            )  # fmt: skip
        else:
            self._kernel["hidden_grad_rows"](
                (-(-H // self.THREADS), -(-n // self.HID_ROWS)), (self.THREADS,),
                (self.z, self.p.b1, self.p.W2, self.e, np.int32(n), np.int32(H), self.scalar(scale), g.b1, g.W2,
                 g.b2),
            )  # fmt: skip

    def update(self, lr: float, reg: float, inv_batch: float, loss_out: Any) -> None:
        """SGD + L2 and loss_out[0] += the batch's loss. With overlap each part of the parameters
        is updated by the next forward (or ``finish``) once its sum is in: X's preparation for the
        next batch runs beside the first part's sum, the first part of z1 beside the second's."""
        if self.overlap:
            self.pending = (lr, reg, inv_batch, loss_out)
        else:
            self._sgd_update(0, lr, reg, inv_batch, loss_out, with_ce=True)

    def finish(self) -> None:
        """Complete what the last update left queued, before anyone reads the weights or the loss."""
        self._finish_update(0)
        self._finish_update(1)

    def _finish_update(self, i: int) -> None:
        """With overlap, the last update of the i-th part of the parameters (update_ranges), on
        the compute stream once NCCL has summed that part; the cross-entropy goes with the last."""
        if self.pending is None:
            return
        self.cp.cuda.get_current_stream().wait_event(self.summed[i])
        self._sgd_update(i, *self.pending, with_ce=i == 1)
        if i == 1:
            self.pending = None

    def _sgd_update(self, i: int, lr: float, reg: float, inv_batch: float, loss_out: Any, with_ce: bool) -> None:
        """sgd_update over the i-th range of the parameters (update_ranges)."""
        s = self.scalar
        blocks, begin, end = self.update_ranges[i]
        ce_sum = self.ce_sum if with_ce else np.uint64(0)  # a null pointer: no cross-entropy
        self._kernel["sgd_update"](
            (blocks,), (self.THREADS,),
            (self.params, self.gbuf, begin, end, *self.bounds, s(lr), s(reg), ce_sum, s(inv_batch), loss_out,
             np.int32(self.blocks), np.int32(self.w_lo_at), np.int32(self.layout.D), self.w1cat, self.hw),
        )  # fmt: skip
