"""One SGD step split in the loop's phases: forward, backward (into the flat gradient buffer),
then, after the all-reduce, the update. Two implementations of the same math:

- GenericStep: model.py's functions, NumPy or CuPy, one array op per kernel. The readable
  reference, and what the CPU ranks and the sequential check run.
- FusedStep (CuPy only): the two large GEMMs (z1 and dW1 = dz1^T X) straight through cuBLAS
  (trainer/gemm.py), and everything else in fused kernels that each pass over the B x H
  activations at most once: the output layer (sigmoid, the 10-wide second layer, softmax, loss),
  the hidden gradient (dz1, dW2, db1, db2) and the SGD+L2 update; with tensor cores also X's
  preparation for the GEMMs, which ``prepare`` does once for the whole run when the batches are
  the same every epoch (trainer/loop.py, no shuffling). No host synchronisation anywhere in the step.

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
  (test_tf32x3_keeps_float32_accuracy; the trained weights' error equals SGEMM's, BENCHMARKS.md).
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
  with 24 bits of W1 and dz1 instead of 22 the gradient is closer to SGEMM's (BENCHMARKS.md).
  Its parts are 16-bit, so dz1's are written to a buffer of their own, not over a^T.

With NCCL the fused step can hide the all-reduce behind its own compute (``overlap``): W1's rows
are taken in two halves. With SGEMM the sum of the first half's dW1 runs on a side stream while
the second half's dW1 is computed; with tensor cores dW1 stays one GEMM (halved, its GEMMs
run too few tiles) and both sums follow it. The update waits for them in the next forward: the
first half's sum runs beside the next batch's X preparation (tensor cores), the second half's
(with db1, dW2, db2 and the loss) while the first half of W1 is updated and the next batch's
first half of z1^T = W1 X^T is computed. So an update is done by the next forward (or by
``finish``, before anyone reads the weights), and the step's "allreduce" and "update" phases
are empty.

Every step has the same five calls, which trainer/loop.py makes in order: forward, backward (or
zero_gradient for a rank without rows), reduce, update, and finish at the end of an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer import model
from trainer.gemm import Gemm, leading

TENSOR_CORE_GEMMS = ("tf32", "tf32x3", "bf16x3")  # the float32 GEMM modes (``gemm``) on tensor cores
SPLIT_GEMMS = ("tf32x3", "bf16x3")  # float32 accuracy from several tensor-core products
TF32_EXACT_INTEGERS = 2**11  # TF32 holds every integer up to this one (11 significant bits)
BF16_EXACT_INTEGERS = 2**8  # and BF16 up to this one (8)


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


class GenericStep:
    def __init__(self, layout: model.Layout, params: Any, gbuf: Any, allreduce: Any = None) -> None:
        self.p, self.g, self.gbuf = layout.views(params), layout.views(gbuf[:-1]), gbuf
        self.allreduce = allreduce

    def prepare(self, x: Any, rows: list[tuple[int, int]]) -> None:
        """Nothing to prepare: the generic step multiplies X as it is (FusedStep.prepare)."""

    def forward(self, x: Any, y: Any) -> None:
        self.a1, z2 = model.forward(self.p, x)
        self.yhat, self.ce_sum = model.softmax_xent(z2, y)

    def backward(self, x: Any, y: Any, scale: float) -> None:
        model.backward(self.p, x, y, self.a1, self.yhat, scale, self.g)
        self.gbuf[-1] = self.ce_sum

    def zero_gradient(self) -> None:
        """Instead of forward and backward when this rank has no rows of the batch."""
        self.gbuf.fill(0)

    def reduce(self) -> None:
        """Sum the gradient (and the loss) over the ranks, if there are several."""
        if self.allreduce is not None:
            self.allreduce(self.gbuf)

    def update(self, lr: float, reg: float, inv_batch: float, loss_out: Any) -> None:
        """loss_out[0] <- this batch's global loss (before the update); then update in place."""
        loss_out[0] = self.gbuf[-1] * inv_batch + model.penalty(self.p, reg)
        model.sgd_update(self.p, self.g, lr, reg)

    def finish(self) -> None:
        """Nothing is left queued: the update is complete when ``update`` returns."""


_KERNELS = r"""
// Defined by FusedStep: T, V (16 bytes of T: float4 or double2), VEC (Ts in a V), C (classes), HW
// (the row length of hw, FusedStep's copy of W2^T and b1: C + 1 rounded up to whole Vs), and the
// block shapes. For z1 row-major (n x H; *_rows kernels): THREADS, OUT_ROWS (rows per block of
// output_layer_rows) and HID_ROWS (rows per block of hidden_grad_rows). For z1 transposed (zt:
// H x ld, sample r of hidden unit h at h ld + r; *_t kernels, which read and write along
// samples): OUT_WARPS and OUT_UNROLL (output_layer_t's warps per block of 32 samples, and the
// rows each warp loads at once); HID_WARPS, HID_H, HID_S and HID_MIN_BLOCKS (hidden_grad_t's
// warps, hidden units and samples per block, and the blocks per SM its registers must allow).

__device__ inline float tf32(float x) {  // round to the nearest TF32 value (10-bit mantissa)
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}
__device__ inline double tf32(double x) { return x; }  // float64 is never split

// 1 / (1 + e^-z). In float32 the reciprocal of x = 1 + e^-z is the fast path of CUDA's IEEE
// division (MUFU.RCP and one Newton step) without its test and branch to the slow path, which x
// never needs once z >= -87 (x < 2^126; below -87, a = 1.6e-38 instead of less; NaN stays NaN):
// the bits of 1.f / (1.f + expf(-z)) for every float32 z in [-87, 88] (BENCHMARKS.md), in fewer
// instructions. __expf would save a few more at a few ulps.
__device__ inline float sigmoid(float z) {
    const float x = 1.f + exp(-(z < -87.f ? -87.f : z));
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return fmaf(r, -fmaf(x, r, -1.f), r);
}
__device__ inline double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

// BF16 (bfloat16) is a float32's top 16 bits: b16 keeps them (truncating), b16_rn rounds to nearest.
__device__ inline unsigned short b16(float v) { return (unsigned short)(__float_as_uint(v) >> 16); }
__device__ inline unsigned short b16_rn(float v) { return (unsigned short)((__float_as_uint(v) + 0x8000u) >> 16); }
__device__ inline float f32(unsigned short b) { return __uint_as_float((unsigned int)b << 16); }

// v as three BF16 parts, small first: out[0] = lo, out[1] = mid, out[2] = hi (v = hi + mid + lo
// to about 2^-24 relative: hi and mid truncated, so the rests are exact, lo rounded).
__device__ inline void bf16_parts(const float v, unsigned short out[3]) {
    out[2] = b16(v);
    const float r = v - f32(out[2]);
    out[1] = b16(r);
    out[0] = b16_rn(r - f32(out[1]));
}

// v into `parts` places `stride` apart (P: the GEMMs' operand type, T or BF16's unsigned short).
// One part: v itself. TF32: hi = v rounded to TF32 in every place but lo_at, which gets lo = v - hi
// rounded (lo_at < 0: hi in all, for v an integer level that TF32 holds exactly: hi = v). BF16:
// [lo | mid | hi] (lo_at < 0: v in all, an integer level that BF16 holds exactly).
__device__ inline void put_parts(P* at, const long long stride, const int parts, const T v, const int lo_at) {
#if BF16
    unsigned short q[3];
    bf16_parts(v, q);
    for (int p = 0; p < parts; ++p) at[p * stride] = lo_at < 0 ? q[2] : q[p];
#else
    if (parts == 1) {
        at[0] = v;
        return;
    }
    const T hi = tf32(v), lo = tf32(v - hi);
    for (int p = 0; p < parts; ++p) at[p * stride] = p == lo_at ? lo : hi;
#endif
}

// VEC consecutive values v[0..VEC) of one row as put_parts does, VEC at a time: each part's VEC
// values go out in one store (one V; BF16: VEC = 4 16-bit values, 8 bytes), so `at` must be
// aligned to that store. Only for the parts of W1 and dz1: BF16's three [lo | mid | hi] (lo_at
// and parts unused), TF32's as put_parts (lo_at >= 0). Every array index is known at compile time
// once unrolled: a runtime one puts q in local memory (the hidden gradient took 52 us, not 32).
__device__ inline void put_parts_vec(P* at, const long long stride, const int parts, const T* v, const int lo_at) {
#if BF16
    unsigned short q[VEC][3];
#pragma unroll
    for (int i = 0; i < VEC; ++i) bf16_parts(v[i], q[i]);
#pragma unroll
    for (int p = 0; p < 3; ++p) {
        const uint2 four = {q[0][p] | ((unsigned)q[1][p] << 16), q[2][p] | ((unsigned)q[3][p] << 16)};
        *reinterpret_cast<uint2*>(at + p * stride) = four;
    }
#else
    V hv, lv;
    T *hi = reinterpret_cast<T*>(&hv), *lo = reinterpret_cast<T*>(&lv);
    if (parts == 1) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) hi[i] = v[i];
        *reinterpret_cast<V*>(at) = hv;
        return;
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
        hi[i] = tf32(v[i]);
        lo[i] = tf32(v[i] - hi[i]);
    }
    for (int p = 0; p < parts; ++p) *reinterpret_cast<V*>(at + p * stride) = p == lo_at ? lv : hv;
#endif
}

extern "C" __global__ void split_tf32(const T* x, const int rows, const int d, const int parts, const int lo_at,
                                      P* out) {
    // out (rows x parts d) <- each row of x (rows x d) as its TF32 parts, side by side (put_parts).
    const long long total = (long long)rows * d;
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total;
         k += (long long)gridDim.x * blockDim.x) {
        const long long r = k / d, j = k - r * d;
        put_parts(out + r * parts * d + j, d, parts, x[k], lo_at);
    }
}

extern "C" __global__ void prepare_x(const T* __restrict__ x, const int n, const int d, const int parts,
                                     const T levels, P* __restrict__ xcat, P* __restrict__ xt, const int ld,
                                     const int part) {
    // The batch's X (n x d) as the GEMMs read it: X^T into xt (row stride ld) for dW1, whose
    // operands must both be K-major: xt[c, r] = X[r, c]. With parts > 1 (float32 accuracy on
    // tensor cores), each value as `parts` TF32 (or BF16) values, into xcat (n x parts d, side by side) for
    // z1 and into xt in column blocks `part` apart: if levels > 0, X's pixels are k / levels with
    // k an integer, exact in TF32 (and BF16), so k in every place; else [lo | hi | hi]. The grid covers the
    // rows to a multiple of 32; rows past n get zeros. Block: 32 x 8 threads, a 32 x 32 tile
    // through shared memory (reads and writes coalesced).
    __shared__ T tile[32][33];
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32, tx = threadIdx.x, lo_at = levels > 0 ? -1 : 0;
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int r = r0 + i, c = c0 + tx;
        T v = 0;
        if (r < n && c < d) {
            v = x[(long long)r * d + c];
            if (levels > 0) v = rint(v * levels);
            if (parts > 1) put_parts(xcat + (long long)r * parts * d + c, d, parts, v, lo_at);
        }
        tile[i][tx] = v;
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32 && c0 + i < d; i += 8)  // X[r0 + tx, c0 + i]
        put_parts(xt + (long long)(c0 + i) * ld + r0 + tx, part, parts, tile[tx][i], lo_at);
}

extern "C" __global__ void output_layer_rows(const T* __restrict__ z1, const T* __restrict__ hw,
                                             const T* __restrict__ b2, const long long* y, const int n, const int H,
                                             T* e, T* ce_sum) {
    // Row-major z1 (n x H, without b1): a block takes OUT_ROWS rows at a time, its THREADS threads
    // splitting the H columns: a = sigmoid(z1 + b1), z2 = a W2^T + b2 (row h of hw holds W2[:, h]
    // and b1[h]); writes e = softmax(z2) - onehot(y) (n x C) and adds its rows' cross-entropies
    // to ce_sum[0] (zeroed by the caller).
    __shared__ T part[32][OUT_ROWS][C];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    T loss = 0;  // warp 0's
    for (int r0 = blockIdx.x * OUT_ROWS; r0 < n; r0 += gridDim.x * OUT_ROWS) {
        T acc[OUT_ROWS][C];
        for (int i = 0; i < OUT_ROWS; ++i)
            for (int c = 0; c < C; ++c) acc[i][c] = 0;
#pragma unroll 2
        for (int h = threadIdx.x; h < H; h += blockDim.x) {
            V wv[HW / VEC];  // W2[:, h] and b1[h] in HW / VEC vector loads, not C + 1 scalar ones
            for (int v = 0; v < HW / VEC; ++v) wv[v] = reinterpret_cast<const V*>(hw + (long long)h * HW)[v];
            const T* w = reinterpret_cast<const T*>(wv);
            T a[OUT_ROWS];
            for (int i = 0; i < OUT_ROWS; ++i)
                a[i] = r0 + i < n ? sigmoid(z1[(long long)(r0 + i) * H + h] + w[C]) : (T)0;
            for (int c = 0; c < C; ++c)
                for (int i = 0; i < OUT_ROWS; ++i) acc[i][c] += a[i] * w[c];
        }
        for (int i = 0; i < OUT_ROWS; ++i)
            for (int c = 0; c < C; ++c) {
                T v = acc[i][c];
                for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
                if (lane == 0) part[warp][i][c] = v;
            }
        __syncthreads();
        for (int i = 0; warp == 0 && i < OUT_ROWS && r0 + i < n; ++i) {  // lane c < C: logit c of row r0 + i
            const int r = r0 + i, yi = (int)y[r];
            T z = 0;
            if (lane < C) {
                z = b2[lane];
                for (int w = 0; w < warps; ++w) z += part[w][i][lane];
            }
            T m = __shfl_sync(0xffffffff, z, 0);  // lanes >= C hold no logit: start them at logit 0
            if (lane < C) m = z;
            for (int off = 16; off > 0; off >>= 1) {
                const T o = __shfl_xor_sync(0xffffffff, m, off);
                m = o > m ? o : m;
            }
            T p = lane < C ? exp(z - m) : (T)0, s = p;
            for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffff, s, off);
            if (lane < C) e[(long long)r * C + lane] = p / s - (lane == yi ? (T)1 : (T)0);
            if (lane == yi) loss += log(s) + m - z;  // -log softmax(z2)_y
        }
        __syncthreads();  // part is refilled for the next rows
    }
    if (warp == 0) {
        for (int off = 16; off > 0; off >>= 1) loss += __shfl_xor_sync(0xffffffff, loss, off);
        if (lane == 0) atomicAdd(ce_sum, loss);
    }
}

extern "C" __global__ void hidden_grad_rows(T* z1, const T* __restrict__ b1, const T* __restrict__ W2,
                                            const T* __restrict__ e, const int n, const int H, const T scale,
                                            T* gb1, T* gW2, T* gb2) {
    // Row-major z1 (n x H). Thread: column h of HID_ROWS rows (rows past n count as zeros). With
    // a = sigmoid(z1 + b1): dz1 = scale (e W2) a (1 - a), written over z1; and the block's sums
    // over its rows added to the gradient (zeroed by the caller): db1 += sum dz1, dW2 += scale
    // e^T a, db2 += scale sum e (blocks of the first column tile).
    __shared__ T es[HID_ROWS * C];
    const int r0 = blockIdx.y * HID_ROWS, rows = min(HID_ROWS, max(0, n - r0));
    for (int k = threadIdx.x; k < rows * C; k += blockDim.x) es[k] = e[(long long)r0 * C + k];
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x < C) {
        T s = 0;
        for (int r = 0; r < rows; ++r) s += es[r * C + threadIdx.x];
        atomicAdd(gb2 + threadIdx.x, scale * s);
    }
    const int h = blockIdx.x * THREADS + threadIdx.x;
    if (h >= H) return;
    T w[C], acc[C];
    for (int c = 0; c < C; ++c) { w[c] = W2[(long long)c * H + h]; acc[c] = 0; }
    const T bh = b1[h];
    T db = 0;
#pragma unroll 4
    for (int r = 0; r < HID_ROWS; ++r) {
        if (r >= rows) break;
        const long long k = (long long)(r0 + r) * H + h;
        const T a = sigmoid(z1[k] + bh);
        T da = 0;
        for (int c = 0; c < C; ++c) {
            const T ec = es[r * C + c];
            da += ec * w[c];
            acc[c] += a * ec;
        }
        const T d = scale * da * a * ((T)1 - a);
        db += d;
        z1[k] = d;
    }
    atomicAdd(gb1 + h, db);
    for (int c = 0; c < C; ++c) atomicAdd(gW2 + (long long)c * H + h, scale * acc[c]);
}

// One element of output_layer_t: a = sigmoid(z + b1[h]), stored at `at` (for hidden_grad_t) if
// `store`, and acc += a W2[:, h] (wv: row h of hw).
__device__ inline void out_row(const V* wv, const T z, T* at, const bool store, T acc[C]) {
    const T* w = reinterpret_cast<const T*>(wv);
    const T a = sigmoid(z + w[C]);
    if (store) *at = a;
#pragma unroll
    for (int c = 0; c < C; ++c) acc[c] += a * w[c];
}

extern "C" __global__ void __launch_bounds__(32 * OUT_WARPS)
output_layer_t(T* __restrict__ zt, const int ld, const T* __restrict__ hw, const T* __restrict__ b2,
               const long long* __restrict__ y, const int n, const int H, T* __restrict__ et, const int estride,
               T* ce_sum) {
    // z1^T is zt's first n columns (H x n, row stride ld, without b1). Block (32 x OUT_WARPS
    // threads): the OUT_S samples (32 or 16) from s0 = OUT_S blockIdx.x against every hidden unit:
    // lane l takes sample s0 + l % OUT_S of the rows h with h % RW = l / OUT_S (RW = 32 / OUT_S
    // rows a warp loads at once; warp w every OUT_WARPS RW-th from w RW, OUT_UNROLL at once;
    // W2[:, h] and b1[h], row h of hw): z2 = a W2^T + b2, a = sigmoid(z1 + b1), and a^T written over
    // z1^T (hidden_grad_t reads it: one store an element here, one sigmoid less there; BENCHMARKS.md).
    // Writes e^T = (softmax(z2) - onehot(y))^T into et (C x estride, zeros past n) and adds the
    // rows' cross-entropies to ce_sum[0] (zeroed by the caller). The whole H in one block: the
    // warps' sums meet in shared memory, not across blocks.
    __shared__ T part[OUT_WARPS][C][32];  // the warps' logits of the block's samples, lane by lane
    constexpr int RW = 32 / OUT_S, STEP = OUT_WARPS * RW;  // rows per warp, per pass of the block
    const int lane = threadIdx.x, warp = threadIdx.y, r = blockIdx.x * OUT_S + lane % OUT_S;
    // The lane's rows h0, h0 + STEP, ... walked with pointers, whole groups of OUT_UNROLL first:
    // with z1^T in L2 the kernel is bound by issuing instructions, and 64-bit indices and per-row
    // masks were half of them (75 a float32 element, now 35; BENCHMARKS.md). In the step z1^T
    // comes partly from memory: the rows OUT_PREFETCH ahead are prefetched into L2. Lanes past n
    // read their column (inside ld) and store nothing.
    const int h0 = warp * RW + lane / OUT_S, rows = h0 < H ? (H - 1 - h0) / STEP + 1 : 0;
    const long long zs = (long long)STEP * ld;
    constexpr int WS = STEP * HW / VEC;  // hw's rows, in Vs
    T* zp = zt + (long long)h0 * ld + r;
    const V* wp = reinterpret_cast<const V*>(hw) + (long long)h0 * (HW / VEC);  // W2[:, h], b1[h]: HW / VEC loads
    const bool store = r < n;
    T acc[C];
#pragma unroll
    for (int c = 0; c < C; ++c) acc[c] = 0;
    int k = 0;
    for (; k + OUT_UNROLL <= rows; k += OUT_UNROLL, zp += OUT_UNROLL * zs, wp += OUT_UNROLL * WS) {
        V wv[OUT_UNROLL][HW / VEC];
        T z[OUT_UNROLL];
#pragma unroll
        for (int u = 0; u < OUT_UNROLL; ++u) {  // every load first: OUT_UNROLL rows in flight
#pragma unroll
            for (int v = 0; v < HW / VEC; ++v) wv[u][v] = wp[u * WS + v];
            z[u] = zp[u * zs];
            if (OUT_PREFETCH && k + OUT_PREFETCH + u < rows)  // into L2, no register held: more bytes in flight
                asm volatile("prefetch.global.L2 [%0];" ::"l"(zp + (OUT_PREFETCH + u) * zs));
        }
#pragma unroll
        for (int u = 0; u < OUT_UNROLL; ++u) out_row(wv[u], z[u], zp + u * zs, store, acc);
    }
    for (; k < rows; ++k, zp += zs, wp += WS) {
        V wv[HW / VEC];
#pragma unroll
        for (int v = 0; v < HW / VEC; ++v) wv[v] = wp[v];
        out_row(wv, *zp, zp, store, acc);
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
        for (int off = 16; off >= OUT_S; off >>= 1) acc[c] += __shfl_down_sync(0xffffffff, acc[c], off);
        part[warp][c][lane] = acc[c];  // lanes past OUT_S: partial sums, not read
    }
    __syncthreads();
    if (warp < C) {  // warp c: logit c of the block's samples
        T z = b2[warp];
        for (int w = 0; w < OUT_WARPS; ++w) z += part[w][warp][lane];
        part[0][warp][lane] = z;
    }
    __syncthreads();
    if (warp > 0) return;
    const bool mine = lane < OUT_S;  // lanes past OUT_S repeat samples: they write nothing
    T z[C], m, s = 0, zy = 0;
    const int yr = r < n ? (int)y[r] : -1;
#pragma unroll
    for (int c = 0; c < C; ++c) z[c] = part[0][c][lane];
    m = z[0];
#pragma unroll
    for (int c = 1; c < C; ++c) m = z[c] > m ? z[c] : m;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        s += exp(z[c] - m);
        zy = c == yr ? z[c] : zy;
    }
    T loss = mine && r < n ? log(s) + m - zy : (T)0;  // -log softmax(z2)_y
#pragma unroll
    for (int c = 0; c < C; ++c)
        if (mine) et[(long long)c * estride + r] = r < n ? exp(z[c] - m) / s - (c == yr ? (T)1 : (T)0) : (T)0;
    for (int off = 16; off > 0; off >>= 1) loss += __shfl_xor_sync(0xffffffff, loss, off);
    if (lane == 0) atomicAdd(ce_sum, loss);
}

extern "C" __global__ void __launch_bounds__(32 * HID_WARPS, HID_MIN_BLOCKS)
hidden_grad_t(T* zt, const int ld, const T* __restrict__ hw, const T* __restrict__ et, const int estride,
              const int n, const int H, const T scale, const int parts, const int lo_at, const int part, P* dp,
              const int dld, T* gb1, T* gW2, T* gb2) {
    // Block (32 x HID_WARPS threads): the HID_S samples (a multiple of 32 VEC) from s0 = blockIdx.y
    // HID_S (lane l: VEC at a time, read and written as one V) of the hidden units [h0, h0 +
    // HID_H), h0 = blockIdx.x HID_H (warp w: every HID_WARPS-th from h0 + w). With a^T in zt
    // (a = sigmoid(z1 + b1), written over z1^T by output_layer_t; row stride ld): dz1 = scale (e
    // W2) a (1 - a), written over a^T for samples r < part (zeros from n on); with parts > 1, as
    // that many TF32 parts in column blocks `part` apart, lo in block lo_at and hi in the others
    // (dW1's K-major operand, put_parts); with BF16 the parts [lo | mid | hi] go to dp (row
    // stride dld), not over a^T. Each warp adds its sums over its samples to the gradient (zeroed
    // by the caller): db1 += sum dz1, dW2 += scale e^T a, and the blocks of the first hidden units
    // db2 += scale sum e.
    __shared__ __align__(16) T es[C][HID_S];  // e^T of the block's samples, zeros past n
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int s0 = blockIdx.y * HID_S, h0 = blockIdx.x * HID_H;
    for (int k = warp * 32 + lane; k < C * HID_S; k += 32 * HID_WARPS) {
        const int c = k / HID_S, s = k - c * HID_S;
        es[c][s] = s0 + s < n ? et[(long long)c * estride + s0 + s] : (T)0;
    }
    __syncthreads();
    for (int c = warp; blockIdx.x == 0 && c < C; c += HID_WARPS) {
        T sum = 0;
        for (int s = lane; s < HID_S; s += 32) sum += es[c][s];
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, off);
        if (lane == 0) atomicAdd(gb2 + c, scale * sum);
    }
    for (int h = h0 + warp; h < min(H, h0 + HID_H); h += HID_WARPS) {
        V wv[HW / VEC];
#pragma unroll
        for (int v = 0; v < HW / VEC; ++v) wv[v] = reinterpret_cast<const V*>(hw + (long long)h * HW)[v];
        const T* w = reinterpret_cast<const T*>(wv);
        T acc[C], db = 0;
#pragma unroll
        for (int c = 0; c < C; ++c) acc[c] = 0;
        T* row = zt + (long long)h * ld + s0;
        V zv[HID_S / (32 * VEC)];  // every load first: the row's samples of this lane in flight at once
#pragma unroll
        for (int k = 0; k < HID_S / (32 * VEC); ++k) {
            const int s = VEC * (32 * k + lane);
            zv[k] = {};
            if (s0 + s < n) zv[k] = *reinterpret_cast<const V*>(row + s);
        }
#pragma unroll
        for (int k = 0; k < HID_S / (32 * VEC); ++k) {
            const int s = VEC * (32 * k + lane), r = s0 + s;
            if (r >= part) break;
            const T* z = reinterpret_cast<const T*>(&zv[k]);
            T a[VEC], da[VEC], d[VEC];
#pragma unroll
            for (int i = 0; i < VEC; ++i) {
                a[i] = r + i < n ? z[i] : (T)0;  // 0: no dz1, no dW2 term
                da[i] = 0;
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const V ev = *reinterpret_cast<const V*>(&es[c][s]);  // one 16-byte load: no bank conflicts
                const T* e = reinterpret_cast<const T*>(&ev);
#pragma unroll
                for (int i = 0; i < VEC; ++i) {
                    da[i] += e[i] * w[c];
                    acc[c] += a[i] * e[i];
                }
            }
#pragma unroll
            for (int i = 0; i < VEC; ++i) {
                d[i] = scale * da[i] * a[i] * ((T)1 - a[i]);
                db += d[i];
            }
            // BF16: the parts to dp; else over a^T, where they were read
            put_parts_vec(BF16 ? dp + (long long)h * dld + s0 + s : (P*)(row + s), part, parts, d, lo_at);
        }
        for (int off = 16; off > 0; off >>= 1) {
            db += __shfl_xor_sync(0xffffffff, db, off);
#pragma unroll
            for (int c = 0; c < C; ++c) acc[c] += __shfl_xor_sync(0xffffffff, acc[c], off);
        }
        if (lane == 0) {
            atomicAdd(gb1 + h, db);
#pragma unroll
            for (int c = 0; c < C; ++c) atomicAdd(gW2 + (long long)c * H + h, scale * acc[c]);
        }
    }
}

extern "C" __global__ void sgd_update(T* p, const T* g, const long long begin, const long long end,
                                      const long long w1_end, const long long w2_begin, const long long w2_end,
                                      const T lr, const T reg, const T* ce_sum, const T inv_batch, T* loss_out,
                                      const int parts, const int lo_at, const int D, P* w1cat, T* hw) {
    // p[k] <- p[k] - lr (g[k] + reg W) for k in [begin, end) (biases: no reg). loss_out[0] +=
    // reg/2 ||W||^2 over these weights before the update, and inv_batch * ce_sum[0] unless ce_sum
    // is null; loss_out must start at 0. The new b1 and W2 also go into hw (H x HW) for
    // output_layer; with parts > 1, the new W1 into w1cat (H x parts D) as its TF32 (or BF16)
    // parts, lo in block lo_at (put_parts), for the next forward's split GEMM. [begin, end) starts
    // on a row of W1 (FusedStep cuts on rows). W1's rows go a V at a time when D is a multiple of
    // VEC (a V never straddles two rows): one 16-byte load or store per V instead of VEC, and one
    // division by D per V (H=2048, bf16x3: 9.8 us, against 13.6 one value a thread; BENCHMARKS.md).
    T pen = 0;
    const long long first = begin + blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long rest = begin;  // where the scalar loop starts
    const bool aligned = ((unsigned long long)p | (unsigned long long)g | (unsigned long long)w1cat) % 16 == 0;
    if (D % VEC == 0 && aligned && begin < w1_end) {
        const long long v_end = (min(end, w1_end) - begin) / VEC;  // whole rows: a multiple of D / VEC
        for (long long i = first - begin; i < v_end; i += stride) {
            const long long k = begin + i * VEC;
            const V wv = *reinterpret_cast<const V*>(p + k), gv = *reinterpret_cast<const V*>(g + k);
            const T *w = reinterpret_cast<const T*>(&wv), *gk = reinterpret_cast<const T*>(&gv);
            V nv;
            T* v = reinterpret_cast<T*>(&nv);
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                pen += w[j] * w[j];
                v[j] = w[j] - lr * (gk[j] + reg * w[j]);
            }
            *reinterpret_cast<V*>(p + k) = nv;
            if (parts > 1) {
                const long long row = k / D;
                put_parts_vec(w1cat + row * parts * D + (k - row * D), D, parts, v, lo_at);
            }
        }
        rest = min(end, w1_end);
    }
    for (long long k = rest + first - begin; k < end; k += stride) {
        const T w = p[k];
        T gk = g[k];
        if (k < w1_end || (k >= w2_begin && k < w2_end)) { pen += w * w; gk += reg * w; }
        const T v = w - lr * gk;
        p[k] = v;
        if (parts > 1 && k < w1_end) {
            const long long row = k / D;
            put_parts(w1cat + row * parts * D + (k - row * D), D, parts, v, lo_at);
        } else if (k >= w1_end && k < w2_end) {  // b1 (H values) or W2 (C x H)
            const long long H = w2_begin - w1_end, j = k - w1_end, c = j / H - 1, h = j - (c + 1) * H;
            hw[h * HW + (c < 0 ? C : c)] = v;
        }
    }
    __shared__ T part[32];
    for (int off = 16; off > 0; off >>= 1) pen += __shfl_down_sync(0xffffffff, pen, off);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = pen;
    __syncthreads();
    if (threadIdx.x == 0) {
        T total = 0;
        for (int w = 0; w < blockDim.x / 32; ++w) total += part[w];
        total *= reg / 2;
        if (blockIdx.x == 0 && ce_sum) total += inv_batch * ce_sum[0];
        atomicAdd(loss_out, total);
    }
}
"""


class FusedStep:
    """The same step in 2 cuBLAS GEMMs, 3 fused kernels (4 with tensor cores: X's preparation, unless
    ``prepare`` made it once) and a memset."""

    KERNELS = _KERNELS  # a class attribute, so benchmarks/gpu_kernels.py can time variants
    # Block shapes: the fastest measured (benchmarks/gpu_kernels.py, BENCHMARKS.md; OUT_UNROLL and
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

    def __init__(
        self,
        layout: model.Layout,
        params: Any,
        gbuf: Any,
        max_rows: int,
        gemm: str,
        allreduce: Any = None,
        overlap: bool = False,
        x_levels: int | None = None,
    ) -> None:
        import cupy as cp

        self.cp, self.layout = cp, layout
        self.p, self.g, self.gbuf = layout.views(params), layout.views(gbuf[:-1]), gbuf
        self.params = params
        dtype = np.dtype(params.dtype)
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
        pdtype = np.dtype(np.uint16) if self.bf16 else dtype  # the GEMMs' operands' storage: BF16 as uint16
        ctype, vtype = {np.dtype(np.float32): ("float", "float4"), np.dtype(np.float64): ("double", "double2")}[dtype]
        vec = 16 // dtype.itemsize
        hw_len = -(-(layout.C + 1) // vec) * vec
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
        module = cp.RawModule(code=head + self.KERNELS)
        names = ("split_tf32", "prepare_x", "output_layer_rows", "hidden_grad_rows", "output_layer_t", "hidden_grad_t")
        names += ("sgd_update",)
        self._kernel = {name: module.get_function(name) for name in names}
        self.gemm = Gemm(dtype, tensor_cores=gemm in TENSOR_CORE_GEMMS, bf16=self.bf16)
        self.alpha = 1 / self.levels if self.levels else 1  # the GEMMs' scale, with X as its levels
        D, H, C = layout.D, layout.H, layout.C
        # Row h: W2[:, h], b1[h], zeros; kept by update(). The kernels read each row in 16-byte loads.
        self.hw = cp.zeros((H, hw_len), dtype=dtype)
        self.hw[:, :C], self.hw[:, C] = self.p.W2.T, self.p.b1
        self.tail = gbuf[H * D :]  # db1, dW2, db2, loss: sums of atomics, zeroed each step
        self.ce_sum = gbuf[-1:]
        self.scalar = dtype.type
        w1_end, w2_begin = H * D, H * D + H  # weights: [0, w1_end) and [w2_begin, w2_end)
        self.bounds = tuple(np.int64(v) for v in (w1_end, w2_begin, w2_begin + C * H))
        # With tensor cores z1 is kept transposed, z (H x ld): z1^T = W1 X^T reads both operands
        # K-major (the summed-over index contiguous), as fast as z1 = X W1^T, and the *_t kernels read
        # and write along samples. a^T, then dz1^T, are written over it (split, its three TF32 parts in three
        # column blocks, each ``part`` wide) and dW1 = dz1^T X reads it and X^T (xt: D x ld, by
        # prepare_x; split, X's parts in three blocks) K-major: from row-major dz1 and X cuBLAS's TF32
        # GEMM is 1.6x slower. A batch's samples are padded with zeros to whole tiles of 32
        # (``padded``: prepare_x's tile, whole Vs in the kernels). SGEMM and DGEMM keep z1 row-major
        # (z1: max_rows x H, dz1 over it): their GEMMs gain nothing from the layouts, and with z1^T the
        # overlapped SGEMM step at 4 GPUs took 0.675 ms instead of 0.619 (0.616 at best, tuned;
        # BENCHMARKS.md).
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
        # The all-reduce, and with overlap W1's rows in two parts, each summed as soon as its dW1 is
        # computed: part 0 = gbuf[:cut] (dW1's first rows), part 1 = the rest (with b1, W2, b2, loss).
        self.allreduce = allreduce
        self.overlap = overlap and hasattr(allreduce, "start")  # NcclAllreduce can
        # The cut on a multiple of 32 rows: row-major z1's column slices then start on a 128-byte
        # boundary (a cut at row 819 of 2048 made the step 1.24x as long as one at row 768, BENCHMARKS.md).
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
        these, forward skips prepare_x (8 to 28 us a step at H=2048, B=3200; BENCHMARKS.md). Costs
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


def make_step(
    kind: str,
    xp: Any,
    layout: model.Layout,
    params: Any,
    gbuf: Any,
    max_rows: int,
    gemm: str = "sgemm",
    allreduce: Any = None,
    overlap: bool = False,
    x_levels: int | None = None,
) -> Any:
    """``kind``: generic, fused, or auto (fused with CuPy, generic with NumPy). ``gemm``: how the
    fused step's float32 GEMMs run (sgemm, tf32, tf32x3; see the module's docstring); float64
    ignores it. ``allreduce`` sums the gradient buffer over the ranks (None: one rank);
    ``overlap``: the fused step hides an NCCL all-reduce behind its compute. ``x_levels``: the
    caller's promise that every input is k / x_levels with k an integer (trainer/data.py's
    pixels), which lets tf32x3 use two products instead of three; None promises nothing."""
    if kind == "fused" or (kind == "auto" and xp is not np):
        if xp is np:
            raise ValueError("step=fused needs the GPU (CuPy); use step=generic or auto on the CPU")
        return FusedStep(layout, params, gbuf, max_rows, gemm, allreduce, overlap, x_levels)
    return GenericStep(layout, params, gbuf, allreduce)
