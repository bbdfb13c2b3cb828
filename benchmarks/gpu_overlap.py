"""Can NCCL's all-reduce run beside a GEMM on these GPUs? The question behind ``overlap``.

    python benchmarks/gpu_overlap.py        # launches mpiexec -n 4 itself, once per NCCL setting

On each rank, 20 times: a GEMM of half of W1's rows at H=2048, B=3200 on the compute stream,
and the all-reduce of half of dW1 (3.2 MB, float32) on a side stream, each alone and both
launched together. If the two run concurrently, "both" is close to max(GEMM, all-reduce);
serialised, it is their sum. The GEMMs (``--layouts``) are the two the overlapped step runs
beside a sum, in the layout the step uses now (z1 kept transposed: "dW1 from dz1^T", the second
half's dW1 = dz1^T[1024:] X, beside the first half's sum; "z1^T rows", the next batch's first
half of z1^T = W1 X^T, beside the second half's sum) and in the one it used before ("dW1
row-major", dz1[:, 1024:]^T X; "z1 columns", X W1[:1024]^T). Varied: the side stream's
priority, the SMs cuBLAS may use (cublasSetSmCountTarget, leaving the rest to NCCL) and
NCCL_MAX_CTAS (NCCL's blocks per GPU). With the whole step's timings (gpu_scaling.py), this
chose gpu.overlap=auto and NCCL_MAX_CTAS=8 (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

ROWS, HALF, D, N = 3200, 1024, 784, 20


def worker(args: argparse.Namespace) -> None:
    import cupy as cp
    from gpu_common import beside, report

    from trainer.gpu.gemm import Gemm
    from trainer.gpu.nccl import NcclAllreduce
    from trainer.ranks import parallel

    world = parallel.join_world(args.nproc)
    cp.cuda.Device(world.local_rank % cp.cuda.runtime.getDeviceCount()).use()
    ar = NcclAllreduce(world, cp.float32)
    rt = cp.cuda.runtime
    sides = {"high": ar.side, "normal": rt.streamCreateWithPriority(rt.streamNonBlocking, 0)}
    gemm = Gemm(cp.float32, tensor_cores=args.gemm == "tf32")
    cublas = ctypes.CDLL(args.libcublas)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]

    def rand(*shape: int) -> Any:
        return cp.random.random(shape, dtype=cp.float32)

    x, w1, dz1, dz1t = rand(ROWS, D), rand(2 * HALF, D), rand(ROWS, 2 * HALF), rand(2 * HALF, ROWS)
    z1, z1t = cp.empty((ROWS, 2 * HALF), dtype=cp.float32), cp.empty((2 * HALF, ROWS), dtype=cp.float32)
    out, buf = cp.empty((HALF, D), dtype=cp.float32), cp.random.random(HALF * D, dtype=cp.float32)
    products = {
        "dW1 from dz1^T": lambda: gemm(dz1t[HALF:], x, out),
        "dW1 row-major": lambda: gemm(dz1[:, HALF:], x, out, ta=True),
        "z1^T rows": lambda: gemm(w1[:HALF], x, z1t[:HALF], tb=True),
        "z1 columns": lambda: gemm(x, w1[:HALF], z1[:, :HALF], tb=True),
    }
    rows = []
    for layout, target in itertools.product(args.layouts, args.sm_free):
        cublas.cublasSetSmCountTarget(ctypes.c_void_p(gemm.handle), ctypes.c_int(sms - target if target else 0))
        for name, side in sides.items():
            row = {"layout": layout, "priority": name, "sm_free": target}
            rows.append(row | beside(world.comm, products[layout], ar, buf, side, N))
    cublas.cublasSetSmCountTarget(ctypes.c_void_p(gemm.handle), ctypes.c_int(0))
    if world.rank == 0:
        report(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gemm", choices=["tf32", "sgemm"], default="tf32")
    parser.add_argument("--sm-free", type=int, nargs="+", default=[0, 16, 32], help="SMs cuBLAS leaves free")
    parser.add_argument("--max-ctas", nargs="+", default=["default", "8", "16"], help="NCCL_MAX_CTAS values")
    parser.add_argument("--libcublas", default="libcublas.so.13")
    parser.add_argument("--layouts", nargs="+", default=["dW1 from dz1^T"], help="GEMMs: see the docstring")
    from gpu_common import launch_workers, pair_columns, run_as_worker_or_parse

    args = run_as_worker_or_parse(parser, worker)
    if args is None:
        return

    from trainer.ranks import parallel

    mb = HALF * D * 4 / 1e6
    print(f"{args.nproc} ranks, GEMM {args.gemm} {HALF}x{D}x{ROWS} and all-reduce of {mb:.1f} MB, us each")
    head = ("layout", "NCCL_MAX_CTAS", "priority", "SMs free", "GEMM", "allred", "both", "sum")
    print(" ".join(f"{h:>14s}" if i < 2 else f"{h:>8s}" for i, h in enumerate(head)))
    for ctas in args.max_ctas:
        env = parallel.mpiexec_env()
        if ctas != "default":
            env["NCCL_MAX_CTAS"] = ctas
        worker_args = ["--gemm", args.gemm, "--libcublas", args.libcublas, "--sm-free", *map(str, args.sm_free),
                       "--layouts", *args.layouts]  # fmt: skip
        for r in launch_workers(__file__, args.nproc, worker_args, env) or []:
            print(f"{r['layout']:>14s} {ctas:>14s} {r['priority']:>8s} {r['sm_free']:8d} {pair_columns(r)}", flush=True)


if __name__ == "__main__":
    main()
