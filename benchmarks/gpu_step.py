"""One GPU: our training step against PyTorch (eager, CUDA graph, torch.compile) and against the
step's GEMMs alone, for H in 512..4096, B=3200, data resident on the GPU.

    python benchmarks/gpu_step.py             # FP32, then TF32 in a fresh process (CUPY_TF32=1)

Prints ms per step and the ratios the targets speak of (issue #4): PyTorch CUDA graph / ours
(want >= 1.5) and ours / its GEMMs alone (want <= 1.25). "its GEMMs" are the cuBLAS calls our
fused step makes, timed alone; "model GEMMs" the model's five products by cupy.matmul. "ours
fused" takes X prepared for its GEMMs once, as the trainer does when the batches come in order
(data.shuffle=false, the default); "X per step" prepares it in every step, as with shuffling.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project, when run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_common import (
    LR,
    PIXEL_LEVELS,
    REG,
    C,
    D,
    fused_step,
    inputs,
    model_gemms,
    our_step,
    report,
    reported,
    time_ms,
)

HIDDEN = (512, 1024, 2048, 4096)
BATCH = 3200


def torch_steps(H: int, xh, yh, tf32: bool, compile_: bool) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = tf32
    dev = torch.device("cuda")
    x, y = torch.from_numpy(xh).to(dev), torch.from_numpy(yh).to(dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    W1 = (torch.randn(H, D, generator=g) / D**0.5).to(dev).requires_grad_()
    W2 = (torch.randn(C, H, generator=g) / H**0.5).to(dev).requires_grad_()
    b1, b2 = torch.zeros(H, device=dev, requires_grad=True), torch.zeros(C, device=dev, requires_grad=True)
    opt = torch.optim.SGD([{"params": [W1, W2], "weight_decay": REG}, {"params": [b1, b2]}], lr=LR)

    def loss_fn(x, y):
        a1 = torch.sigmoid(F.linear(x, W1, b1))
        return F.cross_entropy(F.linear(a1, W2, b2), y)

    def eager() -> None:
        opt.zero_grad(set_to_none=False)
        loss_fn(x, y).backward()
        opt.step()

    out = {"torch eager": time_ms(eager)}

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            eager()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss_fn(x, y).backward()
        opt.step()
    out["torch graph"] = time_ms(graph.replay)

    if compile_:
        try:
            compiled = torch.compile(loss_fn)

            def step_compiled() -> None:
                opt.zero_grad(set_to_none=False)
                compiled(x, y).backward()
                opt.step()

            out["torch.compile"] = time_ms(step_compiled)
        except Exception as e:  # report, don't hide: the table says why it is missing
            print(f"torch.compile failed at H={H}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    return out


# Our step's GEMM modes per process: CuPy reads CUPY_TF32 once, so TF32 runs in a process of its own
# (its PyTorch rows too). label: (gemm, x_levels). "FP32 3xTF32" and "FP32 2xTF32" are float32
# accuracy on tensor cores (tf32x3, trainer/gpu/fused_step.py): three products for inputs of any value, two
# with X as its pixels' integer levels, as the trainer runs it (the inputs are pixels either way);
# "FP32 3xBF16" three BF16 products on the pixels (bf16x3).
VARIANTS = {
    "fp32": {
        "FP32": ("sgemm", None),
        "FP32 3xTF32": ("tf32x3", None),
        "FP32 2xTF32": ("tf32x3", PIXEL_LEVELS),
        "FP32 3xBF16": ("bf16x3", PIXEL_LEVELS),
    },
    "tf32": {"TF32": ("tf32", None)},
}


def measure(mode: str, compile_: bool) -> list[dict]:
    import cupy as cp

    xh, yh = inputs(BATCH)
    x, y = cp.asarray(xh), cp.asarray(yh)
    for label, (gemm, levels) in VARIANTS[mode].items():
        for name, ms in breakdown(2048, gemm, levels).items():
            print(f"breakdown {label:12s} H=2048 {name:34s} {ms * 1e3:8.1f} us", file=sys.stderr)
    rows = []
    for H in HIDDEN:
        common = {
            "ours generic": time_ms(our_step("generic", H, x, y)),
            "model GEMMs": time_ms(model_gemms(H, x)),
            **torch_steps(H, xh, yh, mode == "tf32", compile_),
        }
        for label, (gemm, levels) in VARIANTS[mode].items():
            step = fused_step(H, gemm, x, y, x_levels=levels)
            rows.append(
                {
                    "H": H,
                    "mode": label,
                    "ours fused": time_ms(our_step("fused", H, x, y, gemm=gemm, x_levels=levels)),
                    "X per step": time_ms(our_step("fused", H, x, y, gemm=gemm, x_levels=levels, prepared=False)),
                    "its GEMMs": time_ms(lambda s=step: (s.z1_gemm(x), s.dw1_gemm(x))),
                    **common,
                }
            )
    return rows


def breakdown(H: int, gemm: str, x_levels: int | None) -> dict[str, float]:
    """GPU time of each launch of our fused step, each timed alone (H, B=3200)."""
    import cupy as cp

    xh, yh = inputs(BATCH)
    x, y = cp.asarray(xh), cp.asarray(yh)
    s = fused_step(H, gemm, x, y, x_levels=x_levels)
    loss = cp.zeros(1, dtype=cp.float32)
    products = f" ({s.blocks} {'BF16 ' if s.bf16 else ''}products)" if s.split else ""
    parts = "; levels" if s.levels else "; TF32 parts"
    ops = {"prepare X (X^T" + (parts if s.split else "") + ")": lambda: s.prepare_x(x)} if s.transposed else {}
    ops[("GEMM z1^T = W1 X^T" if s.transposed else "GEMM z1 = X W1^T") + products] = lambda: s.z1_gemm(x)
    ops["output layer (sigmoid..softmax, loss)"] = lambda: s.output_layer(y)
    # Over z1 in place: its values change from the second call on, its time does not.
    ops["hidden gradient (dz1, dW2, db1, db2)"] = lambda: s.hidden_gradient(BATCH, 1 / BATCH)
    ops["GEMM dW1 = dz1^T X" + products] = lambda: s.dw1_gemm(x)
    ops["SGD + L2 update (+ penalty" + (", W1 split)" if s.split else ")")] = lambda: s.update(LR, REG, 1 / BATCH, loss)
    ops["whole step, X prepared in it"] = lambda: (
        s.forward(x, y),
        s.backward(x, y, 1 / BATCH),
        s.update(LR, REG, 1 / BATCH, loss),
    )
    xb = (s.prepare(x, [(0, BATCH)]) or [x])[0]  # as the trainer's batches in order
    ops["whole step, X prepared once"] = lambda: (
        s.forward(xb, y),
        s.backward(xb, y, 1 / BATCH),
        s.update(LR, REG, 1 / BATCH, loss),
    )
    return {name: time_ms(op) for name, op in ops.items()}


def print_table(rows: list[dict]) -> None:
    cols = ["ours fused", "X per step", "its GEMMs", "ours generic", "model GEMMs", "torch eager", "torch graph"]
    cols += ["torch.compile"]
    print(f"{'mode':11s} {'H':>5s} " + " ".join(f"{c:>13s}" for c in cols) + "  graph/ours ours/GEMMs")
    for r in rows:
        cells = " ".join(f"{r[c]:13.3f}" if c in r else f"{'n/a':>13s}" for c in cols)
        print(
            f"{r['mode']:11s} {r['H']:5d} {cells}  {r['torch graph'] / r['ours fused']:10.2f} "
            f"{r['ours fused'] / r['its GEMMs']:10.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["fp32", "tf32"], help="one mode in this process (internal)")
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    if args.mode:
        report(measure(args.mode, not args.no_compile))
        return
    rows = []
    for mode in ("fp32", "tf32"):  # CuPy reads CUPY_TF32 once: a fresh process per mode
        env = {**os.environ, "CUPY_TF32": "1" if mode == "tf32" else "0"}
        cmd = [sys.executable, __file__, "--mode", mode] + (["--no-compile"] if args.no_compile else [])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        sys.stderr.write(out.stderr[-6000:])
        result = reported(out.stdout)
        if result is None:
            sys.exit(f"gpu_step.py --mode {mode} reported nothing (its output is above)")
        rows += result
    print_table(rows)


if __name__ == "__main__":
    main()
