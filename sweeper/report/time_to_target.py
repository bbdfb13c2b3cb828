"""Time to accuracy against GPUs: the training seconds each run took until its test precision first
reached a target (its steps at its trusted time a batch), against nproc, per family of points that
differ only in how a batch is spread over ranks (and, for weak scaling, the batch size); beside it
the speedup in time-to-target and the speedup in throughput (samples/s), both from the same timings.
Where more ranks buy throughput but not convergence (a larger global batch needs more epochs) the
two part, and the figure shows where.

The target is ``report.target`` (a test precision), or else the highest precision in hundredths that
three finished points in four reach. A point that never reaches it is kept, marked "not reached".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.report.analysis import seconds_to_target
from sweeper.report.families import families, point_batch_ms
from sweeper.report.plotting import fmt, grid, log_ticks, palette, save
from sweeper.report.study import Point
from trainer import metrics

REACHED_BY = 0.75  # the default target: reached by this share of the finished points


@dataclass
class Row:
    family: str
    point: Point
    seconds: float | None  # training seconds to the target; None: never reached
    speedup: float | None  # time-to-target of the family's fewest ranks over this one's
    throughput: float | None  # samples/s over the fewest ranks' samples/s
    epoch: int | None = None  # the first epoch at the target; another than the fewest ranks': the speedups part
    base_epoch: int | None = None


def default_target(points: Sequence[Point]) -> float | None:
    """The highest precision, in hundredths, that REACHED_BY of the points reach; None without any."""
    bests = sorted((max(v for _, v in p.precision) for p in points if p.precision), reverse=True)
    if not bests:
        return None
    return math.floor(bests[max(0, math.ceil(REACHED_BY * len(bests)) - 1)] * 100) / 100


def seconds_to(p: Point, target: float) -> float | None:
    """The point's training seconds to ``target``: its SGD steps up to the first epoch that reached it,
    at its trusted time a batch (families.point_batch_ms), the same timing its samples/s come from, so
    the two speedups part only where the steps do. None if never reached. A run recorded without its
    training set's size: its epochs' wall times (analysis.seconds_to_target)."""
    n, batch = p.metrics.get(metrics.N_TRAIN), p.get("batch_size")
    ms = point_batch_ms(p)
    if not (n and isinstance(batch, int) and batch > 0 and math.isfinite(ms)):
        return seconds_to_target(p.precision, p.epoch_s, target)
    epoch = epoch_at(p, target)
    return None if epoch is None else epoch * math.ceil(n / batch) * ms / 1e3


def epoch_at(p: Point, target: float) -> int | None:
    """The first epoch whose test precision reached ``target``; None if none did."""
    return next((e for e, v in sorted(p.precision) if v >= target), None)


def groups(points: Sequence[Point], order: Sequence[str] = ()) -> list[tuple[str, list[Point]]]:
    """The scaling families, split by the keys that time alike but converge apart (lr, reg, seed,
    epochs, ...): each group differs only in nproc (and batch size with it), by increasing nproc."""
    out = []
    for fam in families([p.config for p in points], order):
        split: dict[tuple, list[Point]] = {}
        for i in fam.members:
            split.setdefault(tuple(repr(points[i].get(k)) for k in fam.pooled), []).append(points[i])
        for members in split.values():
            if len({p.nproc for p in members}) > 1:
                fixed = {**fam.fixed, **{k: members[0].get(k) for k in fam.pooled}}
                label = ", ".join(f"{k}={fmt(v)}" for k, v in fixed.items()) or "all points"
                out.append((label, sorted(members, key=lambda p: p.nproc)))
    return out


def rows(points: Sequence[Point], target: float, order: Sequence[str] = ()) -> list[Row]:
    out = []
    for label, members in groups(points, order):
        base = members[0]
        t0, s0 = seconds_to(base, target), base.metrics.get(metrics.SAMPLES_PER_S)
        for p in members:
            t, s = seconds_to(p, target), p.metrics.get(metrics.SAMPLES_PER_S)
            speedup = t0 / t if t0 is not None and t else None
            row = Row(label, p, t, speedup, s / s0 if s and s0 else None)
            row.epoch, row.base_epoch = epoch_at(p, target), epoch_at(base, target)
            out.append(row)
    return out


def figure(table: list[Row], target: float, out: Path) -> Path | str:
    """Time to target against nproc, then both speedups against nproc, a colour per group."""
    if not table:
        return "no family of points that differ only in nproc"
    labels = list(dict.fromkeys(r.family for r in table))
    colours = palette(labels)
    fig, ax = grid(1, 2, width=5.0)
    left, right = ax[0][0], ax[0][1]
    nprocs = sorted({r.point.nproc for r in table})
    reached = [r.seconds for r in table if r.seconds is not None]
    ceiling = (max(reached) if reached else 1.0) * 1.15  # where "not reached" is drawn
    for label in labels:
        mine = [r for r in table if r.family == label]
        colour = colours[fmt(label)]
        xs = [r.point.nproc for r in mine if r.seconds is not None]
        left.plot(xs, [r.seconds for r in mine if r.seconds is not None], "o-", color=colour, label=label)
        for r in mine:
            if r.seconds is None:
                left.plot([r.point.nproc], [ceiling], "x", color=colour, markersize=10)
                left.annotate(
                    "not reached", (r.point.nproc, ceiling), fontsize=7, xytext=(4, -10), textcoords="offset points"
                )
        sp = [(r.point.nproc, r.speedup) for r in mine if r.speedup is not None]
        tp = [(r.point.nproc, r.throughput) for r in mine if r.throughput is not None]
        if sp:
            right.plot(*zip(*sp), "o-", color=colour, label=f"{label}: time to target")
        for r in mine:  # where the two speedups part: the target came at another epoch (other SGD steps)
            if r.speedup is not None and r.epoch != r.base_epoch:
                right.annotate(f"epoch {r.epoch} vs {r.base_epoch}", (r.point.nproc, r.speedup), fontsize=6,
                               color=colour, xytext=(4, 2), textcoords="offset points")  # fmt: skip
        if tp:
            right.plot(*zip(*tp), "s--", color=colour, alpha=0.7, label=f"{label}: samples/s")
    base = nprocs[0]
    right.plot(nprocs, [n / base for n in nprocs], ":", color="grey", label="ideal")
    left.set(xlabel="nproc (ranks)", ylabel="training seconds", title=f"Time to test precision {target:g}")
    right.set(
        xlabel="nproc (ranks)", ylabel=f"speedup over nproc={base}", title="Speedup: convergence against throughput"
    )
    for a in (left, right):
        log_ticks(a, nprocs)
    left.legend(fontsize=7, loc="best")
    right.legend(fontsize=6, loc="best")
    fig.suptitle(f"Time to test precision {target:g} against GPUs: {verdict(table)}")
    return save(fig, out)


def verdict(table: list[Row]) -> str:
    """What the figure shows, from its rows: whether more ranks reach the target sooner, and whether
    that follows the throughput (the same SGD steps) or parts from it (the target at another epoch)."""
    most = [r for r in table if r.speedup is not None and r.point.nproc > 1]
    if not most:
        return "no point with more ranks reached it"
    best = max(most, key=lambda r: r.speedup)
    said = f"nproc={best.point.nproc} reaches it {best.speedup:.2f}x as fast as one rank ({best.family})"
    apart = [r for r in most if r.epoch != r.base_epoch]
    if apart:
        return (
            said + f"; {len(apart)} point(s) reach it at another epoch than their baseline: convergence, not throughput"
        )
    return said + "; at the same epochs: the gain is the throughput's"


def csv_rows(table: list[Row], target: float) -> list[dict[str, Any]]:
    return [
        {
            "family": r.family,
            "point": r.point.name,
            "nproc": r.point.nproc,
            "target_precision": target,
            "seconds_to_target": "not reached" if r.seconds is None else f"{r.seconds:.6g}",
            "speedup_time_to_target": "" if r.speedup is None else f"{r.speedup:.4g}",
            "speedup_samples_per_s": "" if r.throughput is None else f"{r.throughput:.4g}",
            "epoch_at_target": "" if r.epoch is None else r.epoch,
        }
        for r in table
    ]
