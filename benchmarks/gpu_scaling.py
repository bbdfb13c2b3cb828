"""Data-parallel scaling of our fused step over 1, 2 and 4 GPUs of one host: NCCL after the
backward pass with the step's phases replayed as CUDA graphs (nccl-graph, the trainer's default:
gpu.graph=auto; its one-GPU time is the graphed step's too), NCCL overlapped with the step's compute
(nccl-overlap: gpu.overlap=always, as the trainer sets NCCL up for it), NCCL after the backward pass
(nccl), both with NCCL's symmetric window where the trainer takes it (gpu.nccl_window=auto) and never
(-nowin), and the course's host-staged MPI all-reduce (mpi). H=2048 (--hidden).

    python benchmarks/gpu_scaling.py              # launches mpiexec -n 1, 2, 4 itself

weak:   3200 samples per GPU (the global batch grows); efficiency = t(1) / t(P)
strong: global batch 12800 split over the GPUs;     speedup    = t(1) / t(P)

The last columns: the CPU's time to queue one step (rank 0, the GPU idle before it). Where it
exceeds the GPU's time per step, the step is bound by its launches, not by the GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# (kind, label, batch, how the fused step's GEMMs run: trainer/gpu/fused_step.py). The inputs are pixels,
# as the trainer's: tf32x3 multiplies in two products ("2xTF32").
CASES = [
    ("weak", "FP32", 3200, "sgemm"),
    ("weak", "FP32 2xTF32", 3200, "tf32x3"),
    ("weak", "FP32 3xBF16", 3200, "bf16x3"),
    ("weak", "TF32", 3200, "tf32"),
    ("strong", "FP32", 12800, "sgemm"),
    ("strong", "FP32 2xTF32", 12800, "tf32x3"),
    ("strong", "FP32 3xBF16", 12800, "bf16x3"),
    ("strong", "TF32", 12800, "tf32"),
]
# label: (comm, overlap, nccl_window, graph)
COMMS = {
    "nccl-graph": ("nccl", False, "auto", True),
    "nccl": ("nccl", False, "auto", False),
    "nccl-overlap": ("nccl", True, "auto", False),
    "nccl-nowin-overlap": ("nccl", True, "never", False),
    "nccl-nowin": ("nccl", False, "never", False),
    "mpi": ("mpi", False, "never", False),
}


def worker(args: argparse.Namespace) -> None:
    import cupy as cp
    from gpu_common import enqueue_ms, inputs, our_step, report, time_ms

    from trainer.core import model
    from trainer.core.loop import local_rows
    from trainer.gpu.fused_step import FusedStep
    from trainer.gpu.graphs import compute_stream
    from trainer.gpu.policy import sums_beside_gemm, window_wanted
    from trainer.ranks import parallel
    from trainer.ranks.allreduce import make_allreduce

    world = parallel.join_world(args.nproc)
    cp.cuda.Device(world.local_rank % cp.cuda.runtime.getDeviceCount()).use()
    global_batch = args.batch * args.nproc if args.kind == "weak" else args.batch
    lo, hi = local_rows(global_batch, world.size, world.rank)
    xh, yh = inputs(hi - lo, seed=world.rank)
    n = model.Layout(D=784, H=args.hidden).size + 1
    gpus = cp.cuda.runtime.getDeviceCount()
    beside_gemm = args.overlap and sums_beside_gemm(args.gemm)  # as trainer/options.py sets NCCL up
    window = window_wanted(args.window, beside_gemm)
    allreduce = make_allreduce(args.comm, world, True, gpus, cp, n, cp.float32, beside_gemm, window)
    if args.first_part:
        FusedStep.FIRST_PART = args.first_part
    with compute_stream():  # CUDA graphs capture no work on the legacy default stream
        step = our_step(
            "fused", args.hidden, cp.asarray(xh), cp.asarray(yh), allreduce if world.size > 1 else None, global_batch,
            args.gemm, args.overlap, graph=args.graph,
        )  # fmt: skip
        ms, cpu_ms = time_ms(step), enqueue_ms(step)
    if world.rank == 0:
        window = getattr(allreduce, "window_state", "-")
        report({"ms": ms, "cpu_ms": cpu_ms, "comm": type(allreduce).__name__, "window": window})


def run(
    nproc: int, kind: str, gemm: str, batch: int, comm: str, first_part: float | None = None, hidden: int = 2048
) -> tuple[float, float]:
    """ms per step on the GPU, and the CPU's ms to queue one step."""
    from gpu_common import launch_workers

    comm, overlap, window, graph = COMMS[comm]
    args = ["--kind", kind, "--batch", str(batch), "--comm", comm, "--gemm", gemm, "--hidden", str(hidden)]
    args += ["--overlap"] if overlap else []
    args += ["--graph"] if graph else []
    args += ["--window", window]
    args += ["--first-part", str(first_part)] if first_part else []
    result = launch_workers(__file__, nproc, args)
    return (float("nan"), float("nan")) if result is None else (result["ms"], result["cpu_ms"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--kind", default="weak")
    parser.add_argument("--batch", type=int, help="the cases' batch (weak: per GPU; strong: global) instead of theirs")
    parser.add_argument("--comm", default="nccl")
    parser.add_argument("--overlap", action="store_true")
    parser.add_argument("--graph", action="store_true", help="the step's phases as CUDA graphs (gpu.graph=auto)")
    parser.add_argument("--window", default="auto", help="nccl_window: auto, always or never")
    parser.add_argument("--gemm", default="sgemm")
    parser.add_argument("--first-part", type=float, help="overlap: the fraction of W1's rows summed first")
    parser.add_argument("--hidden", type=int, default=2048, help="H, the hidden layer's width")
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--comms", nargs="+", default=list(COMMS), choices=list(COMMS), help="all-reduces to compare")
    parser.add_argument("--cases", nargs="+", help='only these, e.g. "weak TF32" (default: all)')
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"H={args.hidden}")
    head = " ".join(f"{f'{p} GPU ms':>10s}" for p in args.gpus)
    print(f"{'case':22s} {'comm':12s} {head}   ratio t1/tP   CPU ms to queue a step")
    for kind, label, batch, gemm in CASES:
        if args.cases and f"{kind} {label}" not in args.cases:
            continue
        batch = args.batch or batch
        bases = {g: run(1, kind, gemm, batch, "nccl-graph" if g else "mpi", hidden=args.hidden) for g in (False, True)}
        for comm in args.comms:
            base = bases[COMMS[comm][3]]  # one GPU with or without graphs, as the comm's
            runs = [base] + [run(p, kind, gemm, batch, comm, args.first_part, args.hidden) for p in args.gpus[1:]]
            ratios = " ".join(f"{base[0] / t:6.2f}" for t, _ in runs[1:])
            cpu = " ".join(f"{c:6.3f}" for _, c in runs)
            times = " ".join(f"{t:10.3f}" for t, _ in runs)
            print(f"{kind + ' ' + label:22s} {comm:12s} {times}   {ratios}   {cpu}")
            sys.stdout.flush()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
