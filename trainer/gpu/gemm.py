"""Row-major GEMMs for the fused step (fused_step.py): out = op(a) @ op(b), straight to cuBLAS.

cupy.matmul spends ~17 us of CPU per call on checks and dispatch, more than a TF32 GEMM of the
step's size takes on the GPU; a direct call costs a few. Row-major out (m x n) is column-major
out^T, so cuBLAS computes out^T = op(b)^T op(a)^T. cuBLAS's heuristic picks the algorithm:
timing cuBLASLt's other candidates and keeping the fastest (autotuning) gained nothing at the
step's shapes (benchmarks/gpu_gemm.py, docs/benchmarks.md); the operands' layout did.

BF16 operands (stored as uint16: CuPy has no bfloat16 dtype) go through cublasGemmEx, called
with ctypes from the libcublas CuPy loaded, float32 out and float32 accumulation.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

_HANDLES: dict[tuple[int, bool], int] = {}
_CUBLAS: list[Any] = []
# cublas_api.h / library_types.h: cudaDataType_t, cublasComputeType_t, cublasGemmAlgo_t
_R_32F, _R_16BF, _COMPUTE_32F, _GEMM_DEFAULT = 0, 14, 68, -1


def _cublas() -> Any:
    """The libcublas CuPy loaded (found in this process's memory map), with the calls the step makes.
    Called directly: CuPy's own wrappers refuse to run while a stream captures a CUDA graph."""
    if not _CUBLAS:
        with open("/proc/self/maps") as maps:
            paths = [line.split()[-1] for line in maps if "libcublas.so" in line]
        lib = ctypes.CDLL(paths[0] if paths else "libcublas.so")
        P, i = ctypes.c_void_p, ctypes.c_int
        # handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, compute, algo
        lib.cublasGemmEx.argtypes = [P, i, i, i, i, i, P, P, i, i, P, i, i, P, P, i, i, i, i]
        # handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc
        for name in ("cublasSgemm_v2", "cublasDgemm_v2"):
            getattr(lib, name).argtypes = [P, i, i, i, i, i, P, P, i, P, i, P, P, i]
        lib.cublasSetStream_v2.argtypes = [P, P]
        _CUBLAS.append(lib)
    return _CUBLAS[0]


def _checked(call: str, status: int) -> None:
    if status:
        raise RuntimeError(f"{call} failed with cuBLAS status {status}")


def _cublas_handle(tensor_cores: bool) -> int:
    """A cuBLAS handle of our own per device and math mode: CuPy's own handle (and so its
    matmuls elsewhere, e.g. the test-set evaluation) keeps its default math mode."""
    import cupy as cp
    from cupy_backends.cuda.libs import cublas

    key = (cp.cuda.Device().id, tensor_cores)
    if key not in _HANDLES:
        handle = cublas.create()
        if tensor_cores:
            cublas.setMathMode(handle, getattr(cublas, "CUBLAS_TF32_TENSOR_OP_MATH", 3))  # not exported by CuPy 14
        _HANDLES[key] = handle
    return _HANDLES[key]


def leading(v: Any) -> int:
    """The row stride in elements: column slices of a C-contiguous array keep their parent's."""
    return v.strides[0] // v.itemsize


class Gemm:
    """out = op(a) @ op(b) through cublasSgemm (float32; TF32 tensor cores if asked), Dgemm, or
    with ``bf16`` cublasGemmEx on BF16 operands (uint16 arrays) into float32."""

    def __init__(self, dtype: Any, tensor_cores: bool, bf16: bool = False) -> None:
        import cupy as cp
        from cupy_backends.cuda.libs import cublas

        self.cupy, lib = cp, _cublas()
        self.handle = _cublas_handle(tensor_cores and np.dtype(dtype) == np.float32)
        self.op = {False: cublas.CUBLAS_OP_N, True: cublas.CUBLAS_OP_T}
        self.set_stream = lib.cublasSetStream_v2
        gemm = lib.cublasSgemm_v2 if np.dtype(dtype) == np.float32 else lib.cublasDgemm_v2

        def fn(h, ta, tb, m, n, k, alpha, b, ldb, a, lda, beta, out, ldo) -> None:
            _checked("cublas gemm", gemm(h, ta, tb, m, n, k, alpha, b, ldb, a, lda, beta, out, ldo))

        if bf16:
            ex = lib.cublasGemmEx

            def fn(h, ta, tb, m, n, k, alpha, b, ldb, a, lda, beta, out, ldo) -> None:
                status = ex(h, ta, tb, m, n, k, alpha, b, _R_16BF, ldb, a, _R_16BF, lda, beta, out, _R_32F, ldo,
                            _COMPUTE_32F, _GEMM_DEFAULT)  # fmt: skip
                _checked("cublasGemmEx (BF16)", status)

        self.fn = fn
        self.alpha, self.zero = np.ones(1, dtype=dtype), np.zeros(1, dtype=dtype)

    def __call__(self, a: Any, b: Any, out: Any, ta: bool = False, tb: bool = False, alpha: float = 1) -> None:
        """out = alpha op(a) @ op(b); a, b and out: rows contiguous (a column slice of a
        C-contiguous array is fine)."""
        m, n = out.shape
        k = a.shape[0] if ta else a.shape[1]
        op = self.op
        self.alpha[0] = alpha  # read by cuBLAS during the call (host pointer mode), not at the launch
        _checked("cublasSetStream", self.set_stream(self.handle, self.cupy.cuda.get_current_stream().ptr))
        self.fn(
            self.handle, op[tb], op[ta], n, m, k, self.alpha.ctypes.data, b.data.ptr, leading(b),
            a.data.ptr, leading(a), self.zero.ctypes.data, out.data.ptr, leading(out),
        )  # fmt: skip
