"""The gradient's all-reduce, alone and beside a GEMM: NCCL's kernels on a plain buffer (nccl), NCCL's
symmetric kernels on a buffer of its memory window (nccl-window, the trainer's default), and the
copy engines (benchmarks/peer_allreduce.py, an experiment: does an all-reduce that takes no SMs
hide behind the step's GEMMs where NCCL's could not? docs/benchmarks.md, "The all-reduce alone").

    python benchmarks/gpu_allreduce.py          # launches mpiexec -n 4 itself (--nproc)

On each rank, 20 times: the sum of the whole gradient at H=2048 (6.5 MB, float32) or of the first
half of W1's rows (3.2 MB) on a high-priority side stream, alone; the GEMM alone (the tensor
cores' dW1 = dz1^T X of the whole of W1, or SGEMM's of half of it, as the overlapped step runs
them; or, with ``--gemm x-prep``, 3xTF32's preparation of X, which the overlapped tensor-core
step runs beside the first half's sum); both launched together. Also the CPU time of queueing
one sum, and a check that each gives exactly the sum (integer-valued floats) over 10 calls,
whole and in halves.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

H, D, ROWS, N = 2048, 784, 3200, 20
# nccl-window: NCCL on a buffer of its symmetric window (the trainer's default); peer: PeerAllreduce
# queued call by call; peer-graph: as CUDA graphs
COMMS = ("nccl", "nccl-window", "peer", "peer-graph")


def worker(args: argparse.Namespace) -> None:
    import cupy as cp
    from gpu_common import beside, fused_step, inputs, report
    from peer_allreduce import PeerAllreduce

    from trainer.core import model
    from trainer.gpu.gemm import Gemm
    from trainer.gpu.nccl import NcclAllreduce
    from trainer.ranks import parallel

    (comm,), (kind,) = args.comm, args.gemm  # one of each per worker
    world = parallel.join_world(args.nproc)
    cp.cuda.Device(world.local_rank % cp.cuda.runtime.getDeviceCount()).use()
    n, cut = model.Layout(D=D, H=H).size + 1, H // 2 * D
    if comm.startswith("nccl"):
        ar = NcclAllreduce(world, cp.float32, window=comm == "nccl-window")
        whole = ar.empty(n)
    else:
        ar = PeerAllreduce(world, n, cp.float32, graphs=comm == "peer-graph")
        whole = ar.buffer

    # Exact sums: integers below 2^24 add exactly in float32, in any order.
    values = cp.arange(n, dtype=cp.float32) % 1024
    expect = values * (world.size * (world.size + 1) // 2)
    ok = True
    events = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
    for i in range(10):
        whole[:] = values * (world.rank + 1)
        if i % 2:
            ar(whole)
        else:
            ar.start(whole[:cut], events[0])
            ar.start(whole[cut:], events[1])
            for e in events:
                cp.cuda.get_current_stream().wait_event(e)
        ok = ok and bool(cp.array_equal(whole, expect))
    exact = all(world.comm.allgather(ok))

    xh, yh = inputs(ROWS)
    x = cp.asarray(xh)
    gemm = Gemm(cp.float32, tensor_cores=kind == "tf32") if kind != "x-prep" else None
    if kind == "tf32":  # dW1 from dz1^T and X^T, both K-major (the fused step's layout)
        dz1t, xt = cp.random.random((H, ROWS), dtype=cp.float32), cp.ascontiguousarray(x.T)
        out = cp.empty((H, D), cp.float32)

        def product() -> None:
            gemm(dz1t, xt, out, tb=True)
    elif kind == "x-prep":  # 3xTF32's preparation of X, which the overlapped step runs beside the first sum
        prepared = fused_step(H, "tf32x3", x, cp.asarray(yh), x_levels=None)

        def product() -> None:
            prepared.prepare_x(x)
    else:  # SGEMM's second half of dW1 from row-major dz1
        dz1, out = cp.random.random((ROWS, H), dtype=cp.float32), cp.empty((H // 2, D), cp.float32)

        def product() -> None:
            gemm(dz1[:, H // 2 :], x, out, ta=True)

    rows = []
    for size in ("whole", "half"):
        buf = whole if size == "whole" else whole[:cut]
        row = {"comm": comm, "size": size, "exact": exact} | beside(world.comm, product, ar, buf, ar.side, N)
        world.comm.Barrier()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(N):
            ar.sum_on(buf, ar.side)
        row["cpu"] = (time.perf_counter() - t0) / N * 1e6
        cp.cuda.Device().synchronize()
        rows.append(row)
    if world.rank == 0:
        report(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gemm", choices=["tf32", "sgemm", "x-prep"], nargs="+", default=["tf32", "sgemm"])
    parser.add_argument("--comm", choices=COMMS, nargs="+", default=list(COMMS))
    from gpu_common import launch_workers, pair_columns, run_as_worker_or_parse

    args = run_as_worker_or_parse(parser, worker)
    if args is None:
        return

    print(f"{args.nproc} ranks; us per sum, per GEMM, per pair launched together; CPU us to queue one sum")
    head = ("GEMM", "comm", "sum of", "exact", "GEMM", "sum", "both", "GEMM+sum", "CPU")
    print(" ".join(f"{h:>8s}" for h in head))
    for gemm, comm in itertools.product(args.gemm, args.comm):
        for r in launch_workers(__file__, args.nproc, ["--gemm", gemm, "--comm", comm], timeout=90) or []:
            row = f"{gemm:>8s} {r['comm']:>8s} {r['size']:>8s} {r['exact']!s:>8s} {pair_columns(r)} {r['cpu']:8.1f}"
            print(row, flush=True)


if __name__ == "__main__":
    main()
