"""One GPU: the fused step's two bandwidth-bound kernels alone, H=2048, B=3200, float32.

    python benchmarks/gpu_kernels.py

GPU time per launch without the CPU's launch cost (20 launches captured in a CUDA graph):
- output_layer against ablated copies of itself (each removes one part of its work, so the
  differences say where its time goes), over grid sizes;
- hidden_grad over its block shapes (threads per block, rows per block).
This is how FusedStep's OUT_ROWS, HID_ROWS and THREADS were chosen. With --profile-target it
only launches hidden_grad in both of its layouts, for Nsight Compute (BENCHMARKS.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import fused_step, inputs, time_ms

H, B = 2048, 3200
# name -> (text in trainer/steps.py's kernels, its replacement)
ABLATIONS = {
    "as is": None,
    "no W2, b1 loads": (
        "wv[v] = reinterpret_cast<const V*>(hw + (long long)h * HW)[v];",
        "wv[v] = make_float4(v + 1, v + 2, v + 3, v + 4);",
    ),
    "no warp reductions": ("for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);", ""),
    "no softmax tail": (
        "for (int i = 0; warp == 0 && i < OUT_ROWS",
        "for (int i = 0; warp == 0 && n < 0 && i < OUT_ROWS",
    ),
    "no loss atomic": (
        "if (lane == 0) atomicAdd(ce_sum, loss);",
        "if (lane == 0 && loss < (T)-1) atomicAdd(ce_sum, loss);",
    ),
}


def graph_ms(launch, n: int = 20) -> float:
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        launch()
        stream.begin_capture()
        for _ in range(n):
            launch()
        graph = stream.end_capture()
        return time_ms(lambda: graph.launch(stream), steps=10, repeats=5, warmup=2) / n


def shaped(kernels: str, threads: int, out_rows: int, hid_rows: int, x, y):
    """A FusedStep (TF32 GEMMs) compiled from ``kernels`` with these block shapes."""
    from trainer.steps import FusedStep

    shape = {"KERNELS": kernels, "THREADS": threads, "OUT_ROWS": out_rows, "HID_ROWS": hid_rows}
    return fused_step(H, "tf32", x, y, cls=type("Shaped", (FusedStep,), shape))


def profile_target(x, y) -> None:
    """hidden_grad of the SGEMM step (dz1 over z1) and of the TF32 step (dz1 transposed), each
    launched twice after the step's own forward and backward: for a profiler (BENCHMARKS.md)."""
    import cupy as cp

    for gemm in ("sgemm", "tf32"):
        s = fused_step(H, gemm, x, y)
        s.hidden_gradient(B, 1 / B)
    cp.cuda.runtime.deviceSynchronize()


def main() -> None:
    import cupy as cp

    from trainer.steps import FusedStep

    xh, yh = inputs(B)
    x, y = cp.asarray(xh), cp.asarray(yh)
    if "--profile-target" in sys.argv:
        profile_target(x, y)
        return
    print(f"output_layer, us per launch ({cp.cuda.runtime.getDeviceProperties(0)['name'].decode()})")
    print(f"{'variant':20s} {'threads':>7s} {'rows/block':>10s} {'blocks':>6s} {'us':>7s}")
    for name, change in ABLATIONS.items():
        if change is not None and change[0] not in FusedStep.KERNELS:
            raise SystemExit(f"ablation {name!r}: its text is no longer in trainer/steps.py; update ABLATIONS")
        kernels = FusedStep.KERNELS if change is None else FusedStep.KERNELS.replace(*change)
        for threads, out_rows in ((256, 1), (256, 2), (128, 4)):
            s = shaped(kernels, threads, out_rows, 16, x, y)
            us = graph_ms(lambda s=s: s.output_layer(y)) * 1e3
            print(f"{name:20s} {threads:7d} {out_rows:10d} {-(-B // out_rows):6d} {us:7.1f}")
    print("\nhidden_grad, us per launch")
    print(f"{'threads':>7s} {'rows/block':>10s} {'us':>7s}")
    # Its shared tile (threads x (rows + 1) floats) must stay within the 48 KB of a static allocation.
    for threads, hid_rows in ((128, 16), (128, 32), (128, 64), (256, 16), (256, 32)):
        s = shaped(FusedStep.KERNELS, threads, 1, hid_rows, x, y)
        us = graph_ms(lambda s=s: s.hidden_gradient(B, 1 / B)) * 1e3
        print(f"{threads:7d} {hid_rows:10d} {us:7.1f}")


if __name__ == "__main__":
    main()
