"""Scaling figures: time per batch, samples/s, speedup and efficiency against nproc with the
ideal line (course 001 Q2.2, 004 figure 2), the phases per nproc, and the batch-size regimes."""

from __future__ import annotations

import math
from pathlib import Path

from sweeper.report import analysis, families
from sweeper.report.families import Family, Scaling
from sweeper.report.plotting import fmt, grid, log_ticks, palette, save
from sweeper.report.study import Point

REGIME_COLOURS = {"perfect scaling": "#55a868", "diminishing returns": "#dd8452", "maximal data parallelism": "#c44e52"}
PHASE_COLOURS = {
    "h2d": "#8c8c8c",
    "forward": "#4c72b0",
    "backward": "#55a868",
    "allreduce": "#c44e52",
    "sum": "#c44e52",  # the all-reduce split (several ranks): the sum itself and the wait for the slowest rank
    "wait": "#e8a0a0",
    "update": "#dd8452",
}


def scaling_figure(kind: str, fams: list[tuple[Family, list[Scaling]]], out: Path) -> Path:
    """Four panels for the families of one kind, one line per family."""
    fig, ax = grid(1, 4, width=3.9)
    colours = palette([f.label for f, _ in fams])
    nprocs = sorted({r.nproc for _f, rows in fams for r in rows})
    for fam, rows in fams:
        c = colours[fam.label]
        p = [r.nproc for r in rows]
        t = [r.batch_ms for r in rows]
        # The interval: the range of the repeats' medians (trainer/core/timing.py).
        err = [[max(0.0, r.batch_ms - r.lo) for r in rows], [max(0.0, r.hi - r.batch_ms) for r in rows]]
        ax[0][0].errorbar(p, t, yerr=err, marker="o", color=c, capsize=3, label=fam.label)
        spread = [(r.nproc, min(r.repeats), max(r.repeats)) for r in rows if len(r.repeats) > 1]
        if spread:  # perf.repeats: the range of the repeats' medians
            ax[0][0].vlines(*zip(*spread), color=c, lw=4, alpha=0.35)
        ax[0][1].plot(p, [r.samples_per_s for r in rows], marker="o", color=c)
        for a, value, lo, hi in ((ax[0][2], "speedup", "speedup_lo", "speedup_hi"),
                                 (ax[0][3], "efficiency", "efficiency_lo", "efficiency_hi")):  # fmt: skip
            v = [getattr(r, value) for r in rows]
            bars = [[max(0.0, x - getattr(r, lo)) for x, r in zip(v, rows)],
                    [max(0.0, getattr(r, hi) - x) for x, r in zip(v, rows)]]  # fmt: skip
            a.errorbar(p, v, yerr=bars, marker="o", color=c, capsize=3)
        for r in rows:  # timed only with other runs or processes: ringed, and said below the panels
            if not r.trusted:
                values = (r.batch_ms, r.samples_per_s, r.speedup, r.efficiency)
                for a, v in zip(ax[0], values):
                    a.plot(r.nproc, v, "o", ms=13, mfc="none", mec="firebrick", mew=2, zorder=5)
    p0 = nprocs[0]
    ax[0][2].plot(nprocs, [n / p0 for n in nprocs], "k--", lw=1, label="ideal")
    ax[0][3].axhline(1.0, color="k", ls="--", lw=1, label="ideal")
    what = "scaled speedup (p/p0) T0/Tp" if kind == "weak" else "speedup T0/Tp"
    titles = ("time per batch (median, interval of repeats)", "samples per second", what, "efficiency")
    ylabels = ("ms per batch", "samples/s", "speedup", "efficiency")
    for a, title, ylabel in zip(ax[0], titles, ylabels):
        log_ticks(a, nprocs)
        a.set(xlabel="nproc (ranks)", ylabel=ylabel, title=title)
    ax[0][3].set_ylim(0, max(1.1, max(r.efficiency for _f, rows in fams for r in rows) * 1.1))
    ax[0][0].legend(loc="best", fontsize=7)
    ax[0][2].legend(loc="upper left", fontsize=7)
    name = "Weak scaling: rows per rank fixed" if kind == "weak" else "Strong scaling: the global batch fixed"
    fig.suptitle(name)
    warned = [f"{f.label}: {w}" for f, rows in fams for w in families.flags(f, rows)]
    if warned:  # what the numbers cannot be trusted for, where the reader looks
        text = "\n".join(dict.fromkeys(f"! {w}" for w in warned))
        fig.text(0.01, -0.02, text, ha="left", va="top", fontsize=8, color="firebrick", wrap=True)
    return save(fig, out)


def phases_figure(fams: list[tuple[Family, list[Scaling]]], out: Path) -> Path:
    """Stacked median phase times per nproc, one panel per family: what stops scaling."""
    cols = min(4, len(fams))
    rows_n = math.ceil(len(fams) / cols)
    fig, ax = grid(rows_n, cols, width=3.6)
    for k, (fam, rows) in enumerate(fams):
        a = ax[k // cols][k % cols]
        at = list(range(len(rows)))  # positions, labelled by nproc
        bottom = [0.0] * len(rows)
        split = any("sum" in r.phases for r in rows)  # the all-reduce as the sum itself and the wait
        for phase, colour in PHASE_COLOURS.items():
            if phase in (("allreduce",) if split else ("sum", "wait")):
                continue
            values = [r.phases.get(phase, 0.0) for r in rows]
            a.bar(at, values, bottom=bottom, color=colour, label=phase)
            bottom = [b + v for b, v in zip(bottom, values)]
        a.set_xticks(at, [str(r.nproc) for r in rows])
        a.set(xlabel="nproc", ylabel="ms per batch (median)", title=f"{fam.kind}: {fam.label}")
    top = max(sum(r.phases.values()) for _f, rows in fams for r in rows) * 1.08
    for k in range(len(fams)):  # one scale for every panel: the families compare by eye
        ax[k // cols][k % cols].set_ylim(0, top or 1)
    for k in range(len(fams), rows_n * cols):
        ax[k // cols][k % cols].axis("off")
    ax[0][0].legend(loc="upper left", fontsize=7)
    fig.suptitle("Where a batch's time goes, per phase and nproc")
    return save(fig, out)


def batch_regimes(points: list[Point], studies: list[Family]) -> dict[str, list]:
    """Each batch study's regimes (perfect scaling, diminishing returns, maximal) from its steps to
    a common target loss; a study with fewer than three batch sizes that reach it has none."""
    return {label: segs for label, (_t, _pairs, segs) in _steps_to_target(points, studies).items()}


def _steps_to_target(points: list[Point], studies: list[Family]) -> dict[str, tuple[float, list, list]]:
    """Per batch study: its common target loss, (batch size, steps, point) to reach it, its regimes."""
    found: dict[str, tuple[float, list, list]] = {}
    for study in studies:
        members = [points[i] for i in study.members]
        target = analysis.common_target([p.loss for p in members if not p.diverged])
        if target is None:
            continue
        pairs = [(p.get("batch_size"), analysis.steps_to_target(p.loss, target), p) for p in members]
        pairs = [(b, s, p) for b, s, p in pairs if s]
        if len(pairs) >= 3:
            found[study.label] = (
                target,
                pairs,
                analysis.regimes([b for b, _s, _p in pairs], [s for _b, s, _p in pairs]),
            )
    return found


def regimes_figure(points: list[Point], studies: list[Family], out: Path) -> tuple[Path, dict[str, list]]:
    """Steps to a common target loss against batch size (log-log), the regimes labelled."""
    fig, ax = grid(1, 2, width=5.5, height=3.8)
    colours = palette([s.label for s in studies])
    found: dict[str, list] = {}
    for label, (target, pairs, segs) in _steps_to_target(points, studies).items():
        b, s, ps = zip(*pairs)
        c = colours[label]
        ax[0][0].plot(b, s, marker="o", color=c, label=f"{label} (loss <= {target:.3g})")
        ax[0][0].plot(b, [s[0] * b[0] / x for x in b], ls=":", color=c, lw=1)
        seconds = [_seconds_to(p, n) for p, n in zip(ps, s)]
        ax[0][1].plot(b, seconds, marker="o", color=c, label=label)
        found[label] = segs
    shaded: set[str] = set()
    for seg in next(iter(found.values()), []):  # steps do not depend on nproc: one study's regimes shade
        label = None if seg.name in shaded else seg.name
        shaded.add(seg.name)
        for a in ax[0]:
            a.axvspan(
                seg.lo, seg.hi, color=REGIME_COLOURS[seg.name], alpha=0.18, lw=0, label=label if a is ax[0][0] else None
            )
    sizes = sorted({points[i].get("batch_size") for s in studies for i in s.members})
    for a, ylabel, title in (
        (ax[0][0], "steps to the target loss", "Steps to target (dotted: perfect scaling)"),
        (ax[0][1], "seconds to the target loss", "Time to target"),
    ):
        log_ticks(a, sizes)
        a.set_yscale("log")
        a.set(xlabel="batch size", ylabel=ylabel, title=title)
        a.legend(loc="best", fontsize=7)
    fig.suptitle("The regimes of data parallelism: perfect scaling, diminishing returns, maximal (course 004)")
    return save(fig, out), found


def _seconds_to(p: Point, steps: int) -> float:
    """Training seconds to run ``steps`` updates, at the run's median time per batch."""
    return steps * families.point_batch_ms(p) / 1e3


def family_table(fams: list[tuple[Family, list[Scaling]]]) -> list[dict[str, str]]:
    out = []
    for fam, rows in fams:
        for r in rows:
            out.append(
                {
                    "family": f"{fam.kind}: {fam.label}",
                    "nproc": str(r.nproc),
                    "ms per batch": f"{r.batch_ms:.3f}",
                    "interval ms": f"{r.lo:.3f}-{r.hi:.3f}",
                    "samples/s": f"{r.samples_per_s:,.0f}",
                    "speedup": f"{r.speedup:.2f} ({r.speedup_lo:.2f}-{r.speedup_hi:.2f})",
                    "ideal": fmt(r.ideal),
                    "efficiency": f"{r.efficiency:.0%} ({r.efficiency_lo:.0%}-{r.efficiency_hi:.0%})",
                    **{ph: f"{v:.3f}" for ph, v in r.phases.items()},
                }
            )
    return out
