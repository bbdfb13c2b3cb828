"""Where a multi-GPU step's time goes, across its streams: a CUDA event before and after every
launch of the fused step (X's preparation, the GEMMs, the kernels, the updates) and around every
NCCL sum (on the compute stream, or on the side stream when overlapped), read against the step's
start. The machines lent here have Nsight Compute but no Nsight Systems; this is the timeline
those events give. The events themselves add a few us per launch and CPU time per step, so the
steps read longer than in gpu_scaling.py (the TF32 step at 4 GPUs becomes bound by the CPU and
its sum absorbs the ranks' skew): compare the configurations with each other, not with its figures.

    python benchmarks/gpu_timeline.py --nproc 2 --gemm tf32x3 --overlap never always --first-part 0.5 1.0

Rank 0's median over 8 steps of each event's time from the step's start, us, in queue order; a
label ending in ">" is the event before a launch, "<" the one after it. With overlap, the sums of
a step's gradient run during the next step, after its own end ("STEP").
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

H, ROWS = 2048, 3200
TRACED = ("prepare_x", "z1_gemm", "output_layer", "hidden_gradient", "dw1_gemm", "_sgd_update")


def worker(args: argparse.Namespace) -> None:
    import cupy as cp
    from gpu_common import LR, REG, inputs, report

    from trainer.core import model
    from trainer.core.generic_step import gradient_buffer
    from trainer.core.loop import Schedule, sgd_step
    from trainer.gpu.fused_step import FusedStep
    from trainer.gpu.policy import sums_beside_gemm, window_wanted
    from trainer.options import StepOptions
    from trainer.ranks import parallel
    from trainer.ranks.allreduce import make_allreduce

    world = parallel.join_world(args.nproc)
    cp.cuda.Device(world.local_rank % cp.cuda.runtime.getDeviceCount()).use()
    marks: list[tuple[str, object]] = []

    def mark(label: str, stream: int | None = None) -> None:
        event = cp.cuda.Event()
        cp.cuda.runtime.eventRecord(event.ptr, cp.cuda.get_current_stream().ptr if stream is None else stream)
        marks.append((label, event))

    def traced(name: str) -> Any:  # FusedStep's method ``name`` between two marks
        method = getattr(FusedStep, name)

        def run(self: Any, *a: Any, **k: Any) -> None:
            part = a[0] if name == "_sgd_update" else a[1] if name.endswith("gemm") and len(a) > 1 else None
            label = name.lstrip("_") + ("" if part is None else f"[{part}]")
            mark(label + ">")
            method(self, *a, **k)
            mark(label + "<")

        return run

    Traced = type("Traced", (FusedStep,), {name: traced(name) for name in TRACED})
    overlap = args.overlap[0] == "always"
    if args.first_part:
        FusedStep.FIRST_PART = args.first_part[0]
    layout = model.Layout(D=784, H=H)
    beside_gemm = overlap and sums_beside_gemm(args.gemm[0])
    window = window_wanted(args.window, beside_gemm)
    gpus = cp.cuda.runtime.getDeviceCount()
    ar = make_allreduce("nccl", world, True, gpus, cp, layout.size + 1, cp.float32, beside_gemm, window)
    sum_on = ar.sum_on

    def traced_sum(buf: Any, stream: int) -> None:
        mark(f"sum {buf.nbytes / 2**20:.1f} MB>", stream)
        sum_on(buf, stream)
        mark(f"sum {buf.nbytes / 2**20:.1f} MB<", stream)

    ar.sum_on = traced_sum
    xh, yh = inputs(ROWS, seed=world.rank)
    x, y = cp.asarray(xh), cp.asarray(yh)
    params = cp.asarray(model.init_params(layout, 0, "float32"))
    gbuf = gradient_buffer(ar, cp, layout.size + 1, cp.float32)
    step = Traced(layout, params, gbuf, ROWS, StepOptions(kind="fused", gemm=args.gemm[0], overlap=overlap), ar)
    loss = cp.zeros(1, dtype=cp.float32)
    schedule = Schedule(batch_size=ROWS * world.size, lr=LR, reg=REG, epochs=1)
    for i in range(32):  # 20 to warm up, then 12 traced
        if i == 20:
            cp.cuda.Device().synchronize()
            marks.clear()
        if i >= 20:
            mark("STEP")
        sgd_step(step, x, y, schedule.batch_size, schedule, loss)
    step.finish()
    mark("STEP")
    cp.cuda.Device().synchronize()
    starts = [i for i, (label, _) in enumerate(marks) if label == "STEP"]
    times: dict[tuple[int, str], list[float]] = {}
    for s, e in itertools.pairwise(starts[3:-1]):  # 8 whole steps, not the last (it ends with finish())
        for j, (label, event) in enumerate(marks[s + 1 : e + 1]):
            times.setdefault((j, label), []).append(cp.cuda.get_elapsed_time(marks[s][1], event) * 1e3)
    if world.rank == 0:
        medians = [[label, statistics.median(v)] for (_, label), v in sorted(times.items())]
        report({"window": ar.window_state, "marks": medians})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--gemm", nargs="+", default=["tf32x3", "tf32"], choices=["sgemm", "tf32x3", "tf32"])
    parser.add_argument("--overlap", nargs="+", default=["never", "always"], choices=["never", "always"])
    parser.add_argument("--first-part", type=float, nargs="+", help="overlap: the fraction of W1's rows summed first")
    parser.add_argument("--window", default="auto", help="nccl_window: auto, always or never")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from gpu_common import launch_workers

    for gemm, overlap, cut in itertools.product(args.gemm, args.overlap, args.first_part or [None]):
        if overlap == "never" and cut not in (None, (args.first_part or [None])[0]):
            continue  # the cut matters only with overlap
        extra = ["--gemm", gemm, "--overlap", overlap, "--window", args.window]
        extra += ["--first-part", str(cut)] if cut else []
        result = launch_workers(__file__, args.nproc, extra, timeout=120)
        if result is None:
            continue
        what = f"cut {cut}" if overlap == "always" and cut else ""
        print(f"== {gemm}, overlap={overlap} {what}, window {result['window']}, {args.nproc} GPUs")
        print("  ".join(f"{label} {t:.0f}" for label, t in result["marks"]), flush=True)


if __name__ == "__main__":
    main()
