"""One SGD step split in the loop's phases: forward, backward (into the flat gradient buffer),
then, after the all-reduce, the update. Two implementations of the same math:

- GenericStep: model.py's functions, NumPy or CuPy, one array op per kernel. The readable
  reference, and what the CPU ranks and the sequential check run.
- FusedStep (CuPy only): the GEMMs straight through cuBLAS into preallocated buffers, and
  everything else in four fused kernels: bias+sigmoid, softmax+cross-entropy gradient (with the loss and db2),
  sigmoid gradient, and SGD+L2 update (with the L2 penalty of the loss). No host
  synchronisation anywhere in the step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainer import model


class GenericStep:
    def __init__(self, layout: model.Layout, params: Any, gbuf: Any) -> None:
        self.p, self.g, self.gbuf = layout.views(params), layout.views(gbuf[:-1]), gbuf

    def forward(self, x: Any, y: Any) -> None:
        self.a1, z2 = model.forward(self.p, x)
        self.yhat, self.ce_sum = model.softmax_xent(z2, y)

    def backward(self, x: Any, y: Any, scale: float) -> None:
        model.backward(self.p, x, y, self.a1, self.yhat, scale, self.g)
        self.gbuf[-1] = self.ce_sum

    def update(self, lr: float, reg: float, inv_batch: float, loss_out: Any) -> None:
        """loss_out[0] <- this batch's global loss (before the update); then update in place."""
        loss_out[0] = self.gbuf[-1] * inv_batch + model.penalty(self.p, reg)
        model.sgd_update(self.p, self.g, lr, reg)


_KERNELS = r"""
#define C NCLASSES
extern "C" __global__ void softmax_xent_grad(T* z, const T* b2, const long long* y, const int n,
                                             const T scale, T* ce_sum, T* db2) {
    // n rows of C logits. z <- (softmax(z + b2) - onehot(y)) * scale, in place; each block adds
    // its rows' cross-entropies to ce_sum[0] and its column sums of the new z to db2 (both zeroed
    // by the caller).
    T acc[C];
    T loss = 0;
    for (int c = 0; c < C; ++c) acc[c] = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        T* row = z + (long long)i * C;
        T v[C];
        T m = row[0] + b2[0];
        for (int c = 0; c < C; ++c) { v[c] = row[c] + b2[c]; m = v[c] > m ? v[c] : m; }
        const int yi = (int)y[i];
        T s = 0;
        for (int c = 0; c < C; ++c) { v[c] = exp(v[c] - m); s += v[c]; }
        T vy = 0;
        for (int c = 0; c < C; ++c) if (c == yi) vy = v[c];
        loss += log(s) - log(vy);
        const T inv = scale / s;
        for (int c = 0; c < C; ++c) {
            const T d = v[c] * inv - (c == yi ? scale : (T)0);
            row[c] = d;
            acc[c] += d;
        }
    }
    __shared__ T part[32][C + 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1) {
        loss += __shfl_down_sync(0xffffffff, loss, off);
        for (int c = 0; c < C; ++c) acc[c] += __shfl_down_sync(0xffffffff, acc[c], off);
    }
    if (lane == 0) { part[warp][C] = loss; for (int c = 0; c < C; ++c) part[warp][c] = acc[c]; }
    __syncthreads();
    if (threadIdx.x <= C) {
        T total = 0;
        for (int w = 0; w < (blockDim.x + 31) / 32; ++w) total += part[w][threadIdx.x];
        atomicAdd(threadIdx.x == C ? ce_sum : db2 + threadIdx.x, total);
    }
}

extern "C" __global__ void sgd_update(T* p, const T* g, const long long n, const long long w1_end,
                                      const long long w2_begin, const long long w2_end, const T lr,
                                      const T reg, const T* ce_sum, const T inv_batch, T* loss_out) {
    // p <- p - lr (g + reg W) (biases: no reg). loss_out[0] += inv_batch * ce_sum + reg/2 ||W||^2
    // with the weights before the update; loss_out must start at 0.
    T pen = 0;
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < n;
         k += (long long)gridDim.x * blockDim.x) {
        const T w = p[k];
        T gk = g[k];
        if (k < w1_end || (k >= w2_begin && k < w2_end)) { pen += w * w; gk += reg * w; }
        p[k] = w - lr * gk;
    }
    __shared__ T part[32];
    for (int off = 16; off > 0; off >>= 1) pen += __shfl_down_sync(0xffffffff, pen, off);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = pen;
    __syncthreads();
    if (threadIdx.x == 0) {
        T total = 0;
        for (int w = 0; w < blockDim.x / 32; ++w) total += part[w];
        total *= reg / 2;
        if (blockIdx.x == 0) total += inv_batch * ce_sum[0];
        atomicAdd(loss_out, total);
    }
}
"""


class Gemm:
    """out = op(a) @ op(b) for C-contiguous row-major arrays, straight through cuBLAS.

    cupy.matmul spends ~17 us of CPU per call on checks and dispatch, more than a TF32 GEMM of
    this size takes on the GPU; a direct call costs a few. Row-major out (m x n) is column-major
    out^T, so cuBLAS computes out^T = op(b)^T op(a)^T."""

    def __init__(self, dtype: Any) -> None:
        import os

        import cupy as cp
        from cupy_backends.cuda.libs import cublas

        self.cublas, self.cupy = cublas, cp
        self.handle = cp.cuda.device.get_cublas_handle()
        self.op = {False: cublas.CUBLAS_OP_N, True: cublas.CUBLAS_OP_T}
        self.fn = cublas.sgemm if np.dtype(dtype) == np.float32 else cublas.dgemm
        self.one, self.zero = np.ones(1, dtype=dtype), np.zeros(1, dtype=dtype)
        if os.environ.get("CUPY_TF32") == "1" and np.dtype(dtype) == np.float32:
            cublas.setMathMode(self.handle, getattr(cublas, "CUBLAS_TF32_TENSOR_OP_MATH", 3))

    def __call__(self, a: Any, b: Any, out: Any, ta: bool = False, tb: bool = False) -> None:
        """a and b: rows contiguous (a column slice of a C-contiguous array is fine); out: C-contiguous."""
        m, n = out.shape
        k = a.shape[0] if ta else a.shape[1]
        op = self.op
        self.cublas.setStream(self.handle, self.cupy.cuda.get_current_stream().ptr)
        lda, ldb = a.strides[0] // a.itemsize, b.strides[0] // b.itemsize  # column slices keep their row stride
        self.fn(
            self.handle, op[tb], op[ta], n, m, k, self.one.ctypes.data, b.data.ptr, ldb,
            a.data.ptr, lda, self.zero.ctypes.data, out.data.ptr, n,
        )  # fmt: skip


class FusedStep:
    """The same step in 6 cuBLAS calls, 4 fused kernels and a memset, on preallocated buffers."""

    UPDATE_THREADS = 256
    SOFTMAX_THREADS = 256  # 1024 runs out of registers in float64

    def __init__(self, layout: model.Layout, params: Any, gbuf: Any, max_rows: int) -> None:
        import cupy as cp

        self.cp, self.layout = cp, layout
        self.p, self.g, self.gbuf = layout.views(params), layout.views(gbuf[:-1]), gbuf
        self.params = params
        dtype = params.dtype
        ctype = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}[np.dtype(dtype)]
        module = cp.RawModule(code=f"typedef {ctype} T;\n" + _KERNELS.replace("NCLASSES", str(layout.C)))
        self._softmax = module.get_function("softmax_xent_grad")
        self._update = module.get_function("sgd_update")
        self._bias_sigmoid = cp.ElementwiseKernel(
            "raw T b, int32 h", "T a", "a = (T)1 / ((T)1 + exp(-(a + b[i % h])))", "sweepscale_bias_sigmoid"
        )
        self._sigmoid_grad = cp.ElementwiseKernel("T a", "T d", "d = d * a * ((T)1 - a)", "sweepscale_sigmoid_grad")
        self.gemm = Gemm(dtype)
        H, C = layout.H, layout.C
        self.a1 = cp.empty((max_rows, H), dtype=dtype)
        self.z2 = cp.empty((max_rows, C), dtype=dtype)
        self.dz1 = cp.empty((max_rows, H), dtype=dtype)
        self.ones = cp.ones(max_rows, dtype=dtype)
        self.scalar = np.dtype(dtype).type
        n = layout.size
        sm = cp.cuda.Device().attributes["MultiProcessorCount"]
        self.update_blocks = min(-(-n // self.UPDATE_THREADS), 8 * sm)
        self.softmax_blocks = sm
        w1_end, w2_begin = H * layout.D, H * layout.D + H  # weights: [0, w1_end) and [w2_begin, w2_end)
        self.bounds = tuple(np.int64(v) for v in (n, w1_end, w2_begin, w2_begin + C * H))

    def forward(self, x: Any, y: Any) -> None:
        n, gemm = len(x), self.gemm
        a1 = self.a1[:n]
        gemm(x, self.p.W1, a1, tb=True)  # z1 = X W1^T
        self._bias_sigmoid(self.p.b1, self.layout.H, a1)  # a1 = sigmoid(z1 + b1)
        gemm(a1, self.p.W2, self.z2[:n], tb=True)  # z2 = a1 W2^T (b2 is added in the softmax)

    def backward(self, x: Any, y: Any, scale: float) -> None:
        n, g, gemm = len(x), self.g, self.gemm
        a1, dz2, dz1 = self.a1[:n], self.z2[:n], self.dz1[:n]
        tail = self.gbuf[-(self.layout.C + 1) :]  # db2 and the loss slot, next to each other
        self.cp.cuda.runtime.memsetAsync(tail.data.ptr, 0, tail.nbytes, self.cp.cuda.get_current_stream().ptr)
        blocks = min(-(-n // self.SOFTMAX_THREADS), self.softmax_blocks)
        self._softmax(
            (blocks,), (self.SOFTMAX_THREADS,),
            (dz2, self.p.b2, y, np.int32(n), self.scalar(scale), self.gbuf[-1:], g.b2),
        )  # fmt: skip
        gemm(dz2, a1, g.W2, ta=True)  # dW2 = dz2^T a1
        gemm(dz2, self.p.W2, dz1)  # da1 = dz2 W2
        self._sigmoid_grad(a1, dz1)  # dz1 = da1 a1 (1 - a1)
        gemm(self.ones[:n].reshape(1, -1), dz1, g.b1.reshape(1, -1))  # db1 = column sums of dz1
        gemm(dz1, x, g.W1, ta=True)  # dW1 = dz1^T X

    def update(self, lr: float, reg: float, inv_batch: float, loss_out: Any) -> None:
        s = self.scalar
        self._update(
            (self.update_blocks,), (self.UPDATE_THREADS,),
            (self.params, self.gbuf, *self.bounds, s(lr), s(reg), self.gbuf[-1:], s(inv_batch), loss_out),
        )  # fmt: skip


def make_step(kind: str, xp: Any, layout: model.Layout, params: Any, gbuf: Any, max_rows: int) -> Any:
    """``kind``: generic, fused, or auto (fused with CuPy, generic with NumPy)."""
    if kind == "fused" or (kind == "auto" and xp is not np):
        if xp is np:
            raise ValueError("step=fused needs the GPU (CuPy); use step=generic or auto on the CPU")
        return FusedStep(layout, params, gbuf, max_rows)
    return GenericStep(layout, params, gbuf)
