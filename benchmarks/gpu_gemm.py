"""The fused step's GEMMs: cuBLAS's pick, cuBLASLt's candidates, and the operands' layout.

    python benchmarks/gpu_gemm.py              # H=2048, B=3200 and 12800, every float32 mode

For each GEMM of the step (z1 = X W1^T and dW1 = dz1^T X, with 3xTF32 and 3xBF16 their
K-tripled forms; 3xBF16's operands BF16, its output float32), in the operands' layouts the step
used and uses (z1^T = W1 X^T; dW1 from dz1^T and X, or from the K-major dz1^T and X^T), prints
us per call of: cublasSgemm (cublasGemmEx for BF16; trainer/gpu/gemm.py, what the step calls),
cuBLASLt's first heuristic pick, and the fastest of its candidates each timed on the first call
(autotuning, as PyTorch's TunableOp does), with each candidate's tile id and split-K; and the
largest relative difference of the tuned result from cublasSgemm's. The autotuner lives here,
not in the trainer: it gained nothing at the step's shapes (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from gpu_common import D, time_ms

# cuBLASLt's C API (cublasLt.h, CUDA 12 and 13): the enum values and structs used here.
_R_32F, _R_64F, _R_16BF = 0, 1, 14  # cudaDataType_t
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70  # cublasComputeType_t
_DESC_TRANSA, _DESC_TRANSB = 3, 4  # cublasLtMatmulDescAttributes_t
_PREF_MAX_WORKSPACE_BYTES, _PREF_MIN_ALIGNMENT = 1, (5, 6, 7, 8)  # ...PreferenceAttributes_t: A, B, C, D
_ALGO_TILE_ID, _ALGO_SPLITK_NUM = 1, 2  # cublasLtMatmulAlgoConfigAttributes_t
WORKSPACE_BYTES = 32 << 20  # what cuBLAS asks for on Hopper
CANDIDATES = 16  # algorithms asked of the heuristic per shape


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [
        ("algo", _Algo),
        ("workspace", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


_LT: list[Any] = []


def _cublaslt() -> Any:
    """libcublasLt, the one CuPy's cuBLAS loaded (libcublas links it), with its status checked."""
    if _LT:
        return _LT[0]
    from cupy_backends.cuda.libs import cublas  # noqa: F401  (loads libcublas and so libcublasLt)

    with open("/proc/self/maps") as maps:
        paths = [line.split()[-1] for line in maps if "libcublasLt.so" in line]
    lib = ctypes.CDLL(paths[0] if paths else "libcublasLt.so")
    P = ctypes.c_void_p
    # handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, its size, stream
    lib.cublasLtMatmul.argtypes = [P] * 14 + [ctypes.c_size_t, P]
    _LT.append(lib)
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed with status {status}")


def _alignment(ptr: int) -> int:
    """The largest power of two up to 256 that divides the address."""
    return min(256, ptr & -ptr) if ptr else 256


class _Plan:
    """One shape's cuBLASLt descriptors and the algorithm chosen for it."""

    def __init__(
        self, lt: Any, handle: Any, compute: int, dtype: int, shape: tuple, workspace: int, ab_dtype: int | None = None
    ) -> None:
        """``dtype``: the output's and the scale's type; ``ab_dtype`` the operands' (default: the same)."""
        m, n, k, lda, ldb, ldc, ta, tb, align = shape
        self.lt = lt
        self.desc = ctypes.c_void_p()
        _check(lt.cublasLtMatmulDescCreate(ctypes.byref(self.desc), compute, dtype), "MatmulDescCreate")
        for attr, t in ((_DESC_TRANSA, tb), (_DESC_TRANSB, ta)):  # cuBLAS's A is our b (out^T = b^T a^T)
            op = ctypes.c_int32(int(t))
            _check(lt.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(op), 4), "MatmulDescSetAttribute")
        # Column-major shapes as stored: b is n x k (k x n transposed), a is k x m (m x k), out n x m.
        self.layouts = []
        operand = dtype if ab_dtype is None else ab_dtype
        for rows, cols, ld, t in (
            ((k, n) if tb else (n, k)) + (ldb, operand),
            ((m, k) if ta else (k, m)) + (lda, operand),
            (n, m, ldc, dtype),
        ):
            layout = ctypes.c_void_p()
            status = lt.cublasLtMatrixLayoutCreate(
                ctypes.byref(layout), t, ctypes.c_uint64(rows), ctypes.c_uint64(cols), ctypes.c_int64(ld)
            )
            _check(status, "MatrixLayoutCreate")
            self.layouts.append(layout)
        pref = ctypes.c_void_p()
        _check(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "MatmulPreferenceCreate")
        ws = ctypes.c_uint64(workspace)
        lt.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), 8)
        for attr, a in zip(_PREF_MIN_ALIGNMENT, (align[1], align[0], align[2], align[2])):
            value = ctypes.c_uint32(a)
            lt.cublasLtMatmulPreferenceSetAttribute(pref, attr, ctypes.byref(value), 4)
        found = (_Heuristic * CANDIDATES)()
        count = ctypes.c_int()
        A, B, C = self.layouts
        status = lt.cublasLtMatmulAlgoGetHeuristic(
            handle, self.desc, A, B, C, C, pref, CANDIDATES, found, ctypes.byref(count)
        )
        _check(status, "MatmulAlgoGetHeuristic")
        lt.cublasLtMatmulPreferenceDestroy(pref)
        self.candidates = [found[i] for i in range(count.value) if found[i].state == 0]
        if not self.candidates:
            raise RuntimeError(f"cuBLASLt has no algorithm for the GEMM {shape}")
        self.chosen = self.candidates[0]
        self.times_ms: list[float] = []

    def config(self, result: _Heuristic) -> dict[str, int]:
        """The tile and split-K of an algorithm (for the benchmark's report)."""
        out = {}
        for name, attr in (("tile", _ALGO_TILE_ID), ("split_k", _ALGO_SPLITK_NUM)):
            value, written = ctypes.c_uint32(), ctypes.c_size_t()
            self.lt.cublasLtMatmulAlgoConfigGetAttribute(
                ctypes.byref(result.algo), attr, ctypes.byref(value), 4, ctypes.byref(written)
            )
            out[name] = value.value
        return out


class LtGemm:
    """out = op(a) @ op(b) through cuBLASLt with, per shape, the fastest of its heuristic's
    candidates, timed on the first call of that shape (on the call's own buffers, which it
    writes; the call then computes its result as any other). That first call waits for the GPU.
    ``tune=False`` keeps the heuristic's first pick: what cublasSgemm would run. ``bf16``: BF16
    operands (uint16 arrays) into float32, as trainer/gpu/gemm.py's cublasGemmEx (bf16x3)."""

    def __init__(self, dtype: Any, tensor_cores: bool, tune: bool = True, bf16: bool = False) -> None:
        import cupy as cp

        self.cupy, self.tune = cp, tune
        self.lt = _cublaslt()
        self.handle = ctypes.c_void_p()
        _check(self.lt.cublasLtCreate(ctypes.byref(self.handle)), "Create")
        f64 = np.dtype(dtype) == np.float64
        self.dtype = _R_64F if f64 else _R_32F
        self.compute = _COMPUTE_64F if f64 else (_COMPUTE_32F_FAST_TF32 if tensor_cores else _COMPUTE_32F)
        self.ab_dtype = None
        if bf16:
            self.compute, self.ab_dtype = _COMPUTE_32F, _R_16BF
        self.one, self.zero = np.ones(1, dtype=dtype), np.zeros(1, dtype=dtype)
        self.one_ptr, self.zero_ptr = self.one.ctypes.data, self.zero.ctypes.data
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)
        self.plans: dict[tuple, _Plan] = {}

    def plan(self, a: Any, b: Any, out: Any, ta: bool = False, tb: bool = False) -> _Plan:
        m, n = out.shape
        k = a.shape[0] if ta else a.shape[1]
        align = tuple(_alignment(v.data.ptr) for v in (a, b, out))
        shape = (m, n, k, *(v.strides[0] // v.itemsize for v in (a, b, out)), ta, tb, align)
        p = self.plans.get(shape)
        if p is None:
            p = _Plan(self.lt, self.handle, self.compute, self.dtype, shape, WORKSPACE_BYTES, self.ab_dtype)
            self.plans[shape] = p
            if self.tune and len(p.candidates) > 1:
                p.times_ms = [self._time(p, c, a, b, out) for c in p.candidates]
                p.chosen = p.candidates[int(np.argmin(p.times_ms))]
        return p

    def __call__(self, a: Any, b: Any, out: Any, ta: bool = False, tb: bool = False) -> None:
        """a, b and out: rows contiguous (a column slice of a C-contiguous array is fine)."""
        self._run(self.plan(a, b, out, ta, tb), None, a, b, out)

    def _run(self, p: _Plan, result: _Heuristic | None, a: Any, b: Any, out: Any) -> None:
        A, B, C = p.layouts
        status = self.lt.cublasLtMatmul(
            self.handle, p.desc, self.one_ptr, b.data.ptr, A, a.data.ptr, B, self.zero_ptr, out.data.ptr, C,
            out.data.ptr, C, ctypes.addressof((result or p.chosen).algo), self.workspace.data.ptr,
            self.workspace.nbytes, self.cupy.cuda.get_current_stream().ptr,
        )  # fmt: skip
        _check(status, "Matmul")

    def _time(self, p: _Plan, result: _Heuristic, a: Any, b: Any, out: Any, reps: int = 10) -> float:
        """Median ms of one run of the candidate, over ``reps`` runs after two unmeasured."""
        cp = self.cupy
        for _ in range(2):
            self._run(p, result, a, b, out)
        events = [cp.cuda.Event() for _ in range(reps + 1)]
        events[0].record()
        for e in events[1:]:
            self._run(p, result, a, b, out)
            e.record()
        events[-1].synchronize()
        return statistics.median(cp.cuda.get_elapsed_time(s, e) for s, e in itertools.pairwise(events))


# mode -> (tensor cores, K's factor: 3xTF32 and 3xBF16 multiply over three parts in one GEMM)
MODES = {"sgemm": (False, 1), "tf32": (True, 1), "tf32x3": (True, 3), "bf16x3": (True, 3)}


def shapes(H: int, B: int, f: int) -> dict[str, tuple]:
    """(a's shape, b's shape, out's shape, ta, tb) of the step's two GEMMs."""
    return {
        "z1 = X W1^T": ((B, f * D), (H, f * D), (B, H), False, True),
        # Its transpose, as the fused step computes it (z1 kept H x B): both operands K-major too.
        "z1^T = W1 X^T": ((H, f * D), (B, f * D), (H, B), False, True),
        "dW1 = dz1^T X": ((f * B, H), (f * B, D), (H, D), True, False),
        # From dz1^T (H x B) and X as it is (B x D): the fused step's SGEMM and DGEMM.
        "dW1 from dz1^T, X": ((H, f * B), (f * B, D), (H, D), False, False),
        # From dz1^T (H x B) and X^T (D x B): both operands K-major, which the tensor cores' TF32
        # instructions read directly (the fused step's tf32 and tf32x3).
        "dW1 K-major": ((H, f * B), (D, f * B), (H, D), False, True),
    }


def compare(gemms: tuple, case: tuple, bf16: bool = False) -> tuple[float, float, float]:
    """us per call of the three ways on one GEMM; prints the candidates; returns the three times.
    ``bf16``: the operands as BF16 (a float32's top 16 bits, in uint16 arrays)."""
    import cupy as cp

    plain, first, tuned = gemms
    sa, sb, so, ta, tb = case
    a, b = cp.random.random(sa, dtype=cp.float32), cp.random.random(sb, dtype=cp.float32)
    if bf16:
        a, b = ((v.view(cp.uint32) >> 16).astype(cp.uint16) for v in (a, b))
    ref, out = cp.empty(so, dtype=cp.float32), cp.empty(so, dtype=cp.float32)
    t_plain = time_ms(lambda: plain(a, b, ref, ta, tb), steps=20, repeats=5) * 1e3
    t_first = time_ms(lambda: first(a, b, out, ta, tb), steps=20, repeats=5) * 1e3
    p = tuned.plan(a, b, out, ta, tb)
    t_tuned = time_ms(lambda: tuned(a, b, out, ta, tb), steps=20, repeats=5) * 1e3
    err = float(cp.abs(out - ref).max() / cp.abs(ref).max())
    print(f"  cublasSgemm {t_plain:.1f} us, Lt first {t_first:.1f}, Lt tuned {t_tuned:.1f} (max rel. diff {err:.1e})")
    for c, t in zip(p.candidates, p.times_ms):
        mark = " <- chosen" if c is p.chosen else ""
        print(f"    candidate {p.config(c)} waves {c.waves:.2f}: {t * 1e3:.1f} us{mark}")
    return t_plain, t_first, t_tuned


def main() -> None:
    import cupy as cp

    from trainer.gpu.gemm import Gemm

    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, nargs="+", default=[2048])
    parser.add_argument("--batch", type=int, nargs="+", default=[3200, 12800])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    args = parser.parse_args()
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    summary = []
    for mode in args.modes:
        tc, f = MODES[mode]
        bf16 = mode == "bf16x3"
        gemms = (Gemm(cp.float32, tc, bf16), LtGemm(cp.float32, tc, False, bf16), LtGemm(cp.float32, tc, True, bf16))
        for H in args.hidden:
            for B in args.batch:
                for name, case in shapes(H, B, f).items():
                    print(f"\n{mode} H={H} B={B} {name}:")
                    summary.append((mode, H, B, name, *compare(gemms, case, bf16)))
    print("\nmode    H     B      GEMM               cublasSgemm  Lt first  Lt tuned  gain")
    for mode, H, B, name, t0, t1, t2 in summary:
        print(f"{mode:7s} {H:5d} {B:6d} {name:18s} {t0:11.1f} {t1:9.1f} {t2:9.1f} {t0 / t2:5.2f}x")


if __name__ == "__main__":
    main()
