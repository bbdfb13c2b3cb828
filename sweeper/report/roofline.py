"""The roofline with every measured point (course 001 Problem 2, 002 Q2.4-2.6).

As the course does, the roofs use effective rates measured by the runs themselves (Q2.4):
P_flops from the GEMM phases (forward + backward + update), P_pci from the host-to-device and
host-staging copies, P_mpi from the all-reduce, each the best any point reached. The FLOP and
byte model is trainer/core/flops.py's; the datasheet peak of the arithmetic a run used is drawn too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sweeper.report.plotting import grid, palette, save
from sweeper.report.study import Point
from trainer import metrics
from trainer.core import flops


@dataclass
class Measured:
    name: str
    ai: float  # FLOPs per byte moved over PCIe and MPI, per rank and batch
    flops_per_s: float  # achieved, per rank
    compute_flops_per_s: float  # the same FLOPs over the GEMM phases alone
    pci_bw: float | None  # bytes/s over PCIe, when the run moved any
    mpi_bw: float | None


@dataclass
class Rates:
    p_flops: float
    p_pci: float | None
    p_mpi: float | None
    peak: float | None  # datasheet, FLOP/s per device, of the arithmetic used (over its products)
    arithmetic: str = ""  # which arithmetic, e.g. "BF16 tensor cores / 3 products"

    @property
    def bandwidth(self) -> float | None:
        """The combined link rate of the course's Q2.5: 2 / (1/P_pci + 1/P_mpi), or the one there is."""
        links = [b for b in (self.p_pci, self.p_mpi) if b]
        return len(links) / sum(1 / b for b in links) if links else None


def measure(p: Point) -> Measured | None:
    m = p.metrics
    batch_ms = m.get(metrics.phase_time("batch"))
    total = m.get(metrics.FLOPS_PER_BATCH)
    if not batch_ms or not total:
        return None
    per_rank = total / p.nproc
    compute_ms = sum(m.get(metrics.phase_time(ph), 0.0) for ph in ("forward", "backward", "update")) or batch_ms

    def bw(key: str, phase: str) -> float | None:
        moved, ms = m.get(key, 0.0), m.get(metrics.phase_time(phase), 0.0)
        return moved / (ms / 1e3) if moved > 0 and ms > 0 else None

    return Measured(
        p.name,
        m.get(metrics.ARITHMETIC_INTENSITY, math.inf),  # absent: the run moved no byte
        per_rank / (batch_ms / 1e3),
        per_rank / (compute_ms / 1e3),
        bw(metrics.BYTES_PCI, "h2d"),
        bw(metrics.BYTES_MPI, "allreduce"),
    )


def rates(points: list[Point], measured: list[Measured]) -> Rates:
    def best(values: list[float | None]) -> float | None:
        ok = [v for v in values if v]
        return max(ok) if ok else None

    peaks = [
        (float(p.tags[metrics.TAG_PEAK_TFLOPS]) * 1e12, p.tags.get(metrics.TAG_PEAK_ARITHMETIC, ""))
        for p in points
        if p.tags.get(metrics.TAG_PEAK_TFLOPS)
    ]
    return Rates(
        best([x.compute_flops_per_s for x in measured]) or 1.0,
        best([x.pci_bw for x in measured]),
        best([x.mpi_bw for x in measured]),
        *(max(peaks) if peaks else (None, "")),
    )


def roofline_figure(points: list[Point], out: Path) -> tuple[Path, Rates] | str:
    """The roofline of the points' measured rates, or why there is none to draw."""
    measured = [x for x in (measure(p) for p in points) if x is not None]
    if not measured:
        return "no point recorded its FLOP/s (a run on the CPU, or before its first timed batch)"
    r = rates(points, measured)
    finite = [x.ai for x in measured if math.isfinite(x.ai)]
    bw = r.bandwidth
    if not bw:  # one rank, data on the device: a roof of compute alone says nothing about the points
        return "no point moves bytes over PCIe or MPI (one rank, data on the device): no memory roof"
    ridge = r.p_flops / bw if bw else None
    lo = min([*finite, ridge or math.inf, 1.0]) / 10
    hi = max([*finite, ridge or 0, 10.0]) * 10
    ai = np.logspace(math.log10(lo), math.log10(hi), 200)
    fig, ax = grid(1, 1, width=7.5, height=4.8)
    a = ax[0][0]
    if bw:
        serial = [flops.serial_roofline(x, r.p_flops, r.p_pci or r.p_mpi, r.p_mpi if r.p_pci else None) for x in ai]
        a.plot(ai, [flops.roofline(x, r.p_flops, bw) for x in ai], "k-", lw=1.5, label="standard roofline (overlap)")
        a.plot(ai, serial, "k--", lw=1.5, label="course's serial roofline (copies not overlapped)")
    a.axhline(r.p_flops, color="grey", ls=":", lw=1, label=f"P_flops measured {r.p_flops / 1e12:.3g} TFLOP/s")
    if r.peak:
        a.axhline(
            r.peak,
            color="firebrick",
            ls="-.",
            lw=1,
            label=f"datasheet peak {r.peak / 1e12:.3g} TFLOP/s, {r.arithmetic}",
        )
    colours = palette([x.name for x in measured])
    for x in measured:
        at = x.ai if math.isfinite(x.ai) else hi / 1.5
        a.plot(
            at,
            x.flops_per_s,
            "o" if math.isfinite(x.ai) else ">",
            color=colours[x.name],
            ms=7,
            label=x.name + ("" if math.isfinite(x.ai) else " (moves no bytes: AI unbounded)"),
        )
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlim(lo, hi)
    text = [f"P_pci {r.p_pci / 1e9:.3g} GB/s" if r.p_pci else "", f"P_mpi {r.p_mpi / 1e9:.3g} GB/s" if r.p_mpi else ""]
    a.set(
        xlabel="arithmetic intensity (FLOPs per byte over PCIe and MPI, per rank)",
        ylabel="FLOP/s per rank",
        title="Roofline  " + "  ".join(t for t in text if t),
    )
    a.legend(loc="lower right", fontsize=7, ncol=2 if len(measured) > 8 else 1)
    return save(fig, out), r
