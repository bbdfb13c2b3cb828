"""One GPU: the fused step's two bandwidth-bound kernels alone, H=2048, B=3200, float32.

    python benchmarks/gpu_kernels.py

GPU time per launch without the CPU's launch cost (20 launches captured in a CUDA graph) of
output_layer and hidden_grad over their block shapes (trainer/gpu/fused_step.py: output_layer's warps per
block, rows loaded at once and samples per block; hidden_grad's warps, hidden units and samples
per block), hidden_grad as the TF32 step runs it (dz1^T over z1^T), as the 3xTF32 step does (its
three TF32 parts: 26 MB read, 79 MB written), as the 2xTF32 one (tf32x3 on pixels: two parts, 52
MB written) and as the 3xBF16 one (bf16x3, the default: three BF16 parts, 39 MB, to a buffer of
their own). This is how FusedStep's OUT_* and HID_* shapes were chosen (OUT_UNROLL and OUT_PREFETCH
in the whole step, where z1^T comes partly from memory: here it stays in L2). With --profile-target
it only launches the two kernels of the TF32 step twice each, for Nsight Compute (docs/benchmarks.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import PIXEL_LEVELS, fused_step, inputs, time_ms

H, B = 2048, 3200
# (OUT_WARPS, OUT_UNROLL, OUT_SAMPLES) and (HID_WARPS, HID_H, HID_ITER): see FusedStep
OUT_SHAPES = ((32, 4, 32), (32, 2, 32), (32, 1, 32), (16, 4, 32), (16, 2, 32), (8, 2, 32))
OUT_SHAPES += ((32, 2, 16), (32, 1, 16), (16, 2, 16), (16, 4, 16), (16, 1, 16), (8, 4, 16))
HID_SHAPES = ((8, 32, 4), (4, 16, 4), (4, 32, 4), (8, 16, 4), (4, 16, 2), (8, 32, 2), (4, 16, 8))


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


def shaped(gemm: str, x, y, x_levels=None, **shape):
    """A FusedStep (``gemm``'s GEMMs; x_levels: fused_step's) with these block shapes (class
    attributes of FusedStep)."""
    from trainer.gpu.fused_step import FusedStep

    return fused_step(H, gemm, x, y, cls=type("Shaped", (FusedStep,), shape), x_levels=x_levels)


def profile_target(x, y) -> None:
    """output_layer and hidden_grad of the TF32 step, each launched twice after the step's own
    forward and backward: for a profiler (docs/benchmarks.md)."""
    import cupy as cp

    s = fused_step(H, "tf32", x, y)
    for _ in range(2):
        s.output_layer(y)
        s.hidden_gradient(B, 1 / B)
    cp.cuda.runtime.deviceSynchronize()


def main() -> None:
    import cupy as cp

    xh, yh = inputs(B)
    x, y = cp.asarray(xh), cp.asarray(yh)
    if "--profile-target" in sys.argv:
        profile_target(x, y)
        return
    print(f"output_layer, us per launch ({cp.cuda.runtime.getDeviceProperties(0)['name'].decode()})")
    print(f"{'warps':>5s} {'rows at once':>12s} {'samples/block':>13s} {'blocks':>6s} {'us':>7s}")
    for warps, unroll, samples in OUT_SHAPES:
        s = shaped("tf32", x, y, OUT_WARPS=warps, OUT_UNROLL=unroll, OUT_SAMPLES=samples)
        us = graph_ms(lambda s=s: s.output_layer(y)) * 1e3
        print(f"{warps:5d} {unroll:12d} {samples:13d} {B // samples:6d} {us:7.1f}")
    print("\nhidden_grad, us per launch (TF32: dz1^T over z1^T; 3xTF32, 2xTF32: its three, two TF32 parts;")
    print("3xBF16: three BF16 parts to a buffer of their own)")
    head = f"{'warps':>5s} {'hidden/block':>12s} {'samples/block':>13s}"
    print(head + "".join(f"{m:>8s}" for m in ("TF32", "3xTF32", "2xTF32", "3xBF16")))
    for warps, hid_h, hid_iter in HID_SHAPES:
        times = []
        for gemm, levels in (("tf32", None), ("tf32x3", None), ("tf32x3", PIXEL_LEVELS), ("bf16x3", PIXEL_LEVELS)):
            s = shaped(gemm, x, y, levels, HID_WARPS=warps, HID_H=hid_h, HID_ITER=hid_iter)
            times.append(graph_ms(lambda s=s: s.hidden_gradient(B, 1 / B)) * 1e3)
        print(f"{warps:5d} {hid_h:12d} {s.hid_s:13d}" + "".join(f"{t:8.1f}" for t in times))


if __name__ == "__main__":
    main()
