"""Shared by the GPU benchmarks: timing with CUDA events, inputs, our step on resident data, and
the ranks of a multi-GPU benchmark started under mpiexec."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from trainer.data import PIXEL_LEVELS  # the benchmarks put the project on sys.path before importing this

D, C, REG, LR = 784, 10, 1e-4, 1e-3


def time_ms(step: Callable[[], None], steps: int = 100, repeats: int = 7, warmup: int = 20) -> float:
    """Median over ``repeats`` of the mean time of ``steps`` back-to-back calls, by CUDA events."""
    import cupy as cp

    for _ in range(warmup):
        step()
    cp.cuda.get_current_stream().synchronize()
    samples = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(steps):
            step()
        stop.record()
        stop.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, stop) / steps)
    return statistics.median(samples)


def enqueue_ms(step: Callable[[], None], samples: int = 21) -> float:
    """The CPU's time to queue one call of ``step`` on an idle GPU (median): a step whose CPU time
    exceeds its GPU time leaves the GPU waiting for launches."""
    import cupy as cp

    times = []
    for _ in range(samples):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    cp.cuda.Device().synchronize()
    return statistics.median(times)


def inputs(batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random pixels, bytes / 255 as trainer/data.py scales them, and labels (never all zeros:
    they hide bugs and time differently)."""
    rng = np.random.default_rng(seed)
    k = rng.integers(0, 256, (batch, D)).astype(np.float32)
    return k / np.float32(PIXEL_LEVELS), rng.integers(0, C, batch)


def our_step(
    kind: str,
    H: int,
    x: Any,
    y: Any,
    allreduce: Callable[[Any], None] | None = None,
    global_batch: int = 0,
    gemm: str = "sgemm",
    overlap: bool = False,
    x_levels: int | None = PIXEL_LEVELS,
    prepared: bool = True,
    graph: bool = False,
) -> Callable[[], None]:
    """One training step of ours on resident data (this rank's rows x, labels y), exactly as
    trainer/core/loop.py runs it; the gradient is normalised by the global batch (default: len(y)).
    ``gemm``: how the fused step's GEMMs run (sgemm, tf32, tf32x3); ``overlap``: the fused step
    hides an NCCL all-reduce behind its compute (each call then leaves the end of its update to
    the next, as in training); ``x_levels``: x is pixels (``inputs``), as the trainer promises
    (tf32x3 in two products; None: three); ``prepared``: X prepared for the GEMMs once, as the
    trainer does when its batches come in order (the default; else each step prepares its X, as
    with data.shuffle=true); ``graph``: its phases replayed as CUDA graphs (gpu.graph=auto; call it
    under trainer/gpu/graphs.py compute_stream)."""
    import cupy as cp

    from trainer.core import model
    from trainer.core.generic_step import gradient_buffer
    from trainer.core.loop import Schedule, sgd_step
    from trainer.options import StepOptions
    from trainer.step import make_step

    layout = model.Layout(D=D, H=H, C=C)
    params = cp.asarray(model.init_params(layout, 0, "float32"))
    gbuf = gradient_buffer(allreduce, cp, layout.size + 1, cp.float32)  # NCCL's window, if it has one
    options = StepOptions(kind=kind, gemm=gemm, overlap=overlap, x_levels=x_levels, graph=graph)
    step = make_step(options, cp, layout, params, gbuf, len(y), allreduce)
    loss = cp.zeros(1, dtype=cp.float32)
    schedule = Schedule(batch_size=global_batch or len(y), lr=LR, reg=REG, epochs=1)
    batch = (step.prepare(x, [(0, len(x))]) or [x])[0] if prepared else x

    def run() -> None:
        loss.fill(0)
        sgd_step(step, batch, y, schedule.batch_size, schedule, loss)

    return run


def model_gemms(H: int, x: Any) -> Callable[[], None]:
    """The model's five GEMMs alone (cupy.matmul, the mode CUPY_TF32 says), on buffers of the
    step's shapes: what any implementation of the step multiplies."""
    import cupy as cp

    B = len(x)
    W1, W2 = cp.random.random((H, D), dtype=cp.float32), cp.random.random((C, H), dtype=cp.float32)
    a1, z2 = cp.empty((B, H), cp.float32), cp.empty((B, C), cp.float32)
    dz1, gW1, gW2 = cp.empty((B, H), cp.float32), cp.empty((H, D), cp.float32), cp.empty((C, H), cp.float32)

    def run() -> None:
        cp.matmul(x, W1.T, out=a1)
        cp.matmul(a1, W2.T, out=z2)
        cp.matmul(z2.T, a1, out=gW2)
        cp.matmul(z2, W2, out=dz1)
        cp.matmul(dz1.T, x, out=gW1)

    return run


def fused_step(H: int, gemm: str, x: Any, y: Any, cls: Any = None, x_levels: int | None = PIXEL_LEVELS) -> Any:
    """A FusedStep (or subclass ``cls``) that has run forward and backward once on (x, y), so its
    buffers hold a step's values: for timing its launches one by one (``x_levels``: our_step's)."""
    import cupy as cp

    from trainer.core import model
    from trainer.gpu.fused_step import FusedStep
    from trainer.options import StepOptions

    layout = model.Layout(D=D, H=H, C=C)
    params = cp.asarray(model.init_params(layout, 0, "float32"))
    gbuf = cp.zeros(layout.size + 1, dtype=cp.float32)
    s = (cls or FusedStep)(layout, params, gbuf, len(x), StepOptions(kind="fused", gemm=gemm, x_levels=x_levels))
    s.forward(x, y)
    s.backward(x, y, 1 / len(x))
    return s


def beside(comm: Any, product: Callable[[], None], allreduce: Any, buf: Any, side: int, n: int = 20) -> dict:
    """ms per call of ``product`` (a GEMM) alone, of the sum of ``buf`` alone on the stream
    ``side``, and of both launched together, n of each: if the two run concurrently, "both" is
    close to the longer one; serialised, to their sum. ``comm`` (MPI) lines the ranks up."""
    import cupy as cp

    done = cp.cuda.Event(disable_timing=True)

    def products() -> None:
        for _ in range(n):
            product()

    def sums(with_products: bool = False) -> None:
        allreduce.ready.record()  # the side stream starts after the work queued so far
        cp.cuda.runtime.streamWaitEvent(side, allreduce.ready.ptr)
        for _ in range(n):
            allreduce.sum_on(buf, side)
        if with_products:
            products()
        cp.cuda.runtime.eventRecord(done.ptr, side)
        cp.cuda.get_current_stream().wait_event(done)  # so the timing covers both

    times = {}
    for key, fn in (("gemm", products), ("allreduce", sums), ("both", lambda: sums(with_products=True))):
        comm.Barrier()
        times[key] = time_ms(fn, steps=1) / n
    return times


def pair_columns(row: dict) -> str:
    """``beside``'s times as columns, us: GEMM, sum, both, GEMM + sum."""
    us = [row[k] * 1e3 for k in ("gemm", "allreduce", "both")]
    return " ".join(f"{v:8.1f}" for v in (*us, us[0] + us[1]))


def report(result: Any) -> None:
    """A worker process's result, printed for its launcher (``reported``; by rank 0 under mpiexec)."""
    print("JSON " + json.dumps(result), flush=True)


def reported(stdout: str) -> Any:
    """What a worker printed with ``report``, or None if it printed nothing so."""
    lines = [line for line in stdout.splitlines() if line.startswith("JSON ")]
    return json.loads(lines[0][5:]) if lines else None


def launch_workers(
    script: str, nproc: int, args: list[str], env: dict[str, str] | None = None, timeout: float = 300
) -> Any:
    """Run ``script --worker --nproc N args`` on N ranks under mpiexec; return what rank 0
    reported, or None after printing the ranks' output (a failure, or no end within ``timeout``)."""
    from trainer.ranks import parallel

    cmd = [parallel.find_mpiexec(None), "-n", str(nproc), sys.executable, script, "--worker", "--nproc", str(nproc)]
    try:
        out = subprocess.run(
            cmd + args, env=env or parallel.mpiexec_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        sys.stderr.write(f"{Path(script).name} {' '.join(args)}: no end after {timeout} s\n")
        return None
    result = reported(out.stdout)
    if out.returncode or result is None:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        return None
    return result


def run_as_worker_or_parse(parser: argparse.ArgumentParser, worker: Callable[[Any], None]) -> Any | None:
    """The multi-rank benchmarks' entry: with --worker (as launch_workers starts the ranks) run
    ``worker`` and return None; else return the parsed arguments for the launching process."""
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--nproc", type=int, default=4)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return None
    return args
