"""What a study's points say, computed from their configs and records: pure, no I/O.

- the axes: config keys whose values differ between points, in the sweep's order;
- scaling families, recognised from configs (never from names): points that differ only in
  ``nproc`` (strong scaling) or only in ``nproc`` and ``batch_size`` with ``batch_size/nproc``
  fixed (weak scaling);
- batch-size studies and their regimes of data parallelism (the course's 004, after Shallue et
  al.): doubling the batch halves the steps to a target (perfect scaling), saves less
  (diminishing returns), or saves nothing (maximal data parallelism);
- divergence: a loss that turns NaN or rises past its start.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# The order in which axes colour and split figures when the sweep's own order is unknown.
AXIS_ORDER = ("lr", "hidden", "batch_size", "epochs", "nproc", "reg", "dtype", "seed")
# Slopes of log(steps to target) against log(batch size) that bound the regimes.
PERFECT_SLOPE, MAXIMAL_SLOPE = -0.75, -0.15


def axes(configs: Sequence[dict[str, Any]], order: Sequence[str] = ()) -> list[str]:
    """Keys whose values differ between configs: the sweep's order first, then AXIS_ORDER, then by name."""
    keys = {k for c in configs for k in c}
    varying = [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]
    rank: dict[str, int] = {}
    for k in (*order, *AXIS_ORDER):
        rank.setdefault(k, len(rank))
    return sorted(varying, key=lambda k: (rank.get(k, len(rank)), k))


@dataclass
class Family:
    """Points that differ only in how a batch is spread over ranks."""

    kind: str  # "strong" (same global batch) or "weak" (same rows per rank)
    fixed: dict[str, Any]  # what identifies the family: the other axes' values
    members: list[int]  # indices into the configs, by increasing nproc

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.fixed.items()) or "all points"


def families(configs: Sequence[dict[str, Any]], order: Sequence[str] = ()) -> list[Family]:
    """Strong and weak scaling families: at least two distinct nproc each."""
    axis = axes(configs, order)
    if "nproc" not in axis:
        return []
    rest = [k for k in axis if k not in ("nproc", "batch_size")]
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault(tuple(repr(c.get(k)) for k in rest), []).append(i)
    found: list[Family] = []
    for members in groups.values():
        fixed = {k: configs[members[0]].get(k) for k in rest}
        for kind, key in (("strong", _batch), ("weak", _rows_per_rank)):
            by_value: dict[Any, list[int]] = {}
            for i in members:
                by_value.setdefault(key(configs[i]), []).append(i)
            for value, idx in sorted(by_value.items(), key=lambda kv: kv[0]):
                nprocs = {configs[i]["nproc"] for i in idx}
                batches = {configs[i].get("batch_size") for i in idx}
                # A weak family needs the batch to grow with nproc; else it is a strong one.
                if len(nprocs) < 2 or len(nprocs) != len(idx) or (kind == "weak" and len(batches) < 2):
                    continue
                label = {"batch_size": value} if kind == "strong" else {"rows per rank": value}
                found.append(Family(kind, {**fixed, **label}, sorted(idx, key=lambda i: configs[i]["nproc"])))
    return found


def _batch(c: dict[str, Any]) -> Any:
    return c.get("batch_size")


def _rows_per_rank(c: dict[str, Any]) -> Any:
    b, p = c.get("batch_size"), c.get("nproc", 1)
    return b / p if isinstance(b, int) and b % p else (b // p if isinstance(b, int) else b)


def batch_studies(configs: Sequence[dict[str, Any]], order: Sequence[str] = ()) -> list[Family]:
    """Groups of at least three points that differ only in batch_size (one per nproc and other axes)."""
    axis = axes(configs, order)
    if "batch_size" not in axis:
        return []
    rest = [k for k in axis if k != "batch_size"]
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault(tuple(repr(c.get(k)) for k in rest), []).append(i)
    out = []
    for idx in groups.values():
        if len({configs[i]["batch_size"] for i in idx}) >= 3:
            fixed = {k: configs[idx[0]].get(k) for k in rest}
            out.append(Family("batch", fixed, sorted(idx, key=lambda i: configs[i]["batch_size"])))
    return out


@dataclass
class Scaling:
    """One family member's figures; speedup and efficiency against the family's smallest nproc."""

    nproc: int
    batch_ms: float
    batch_q1: float
    batch_q3: float
    samples_per_s: float
    speedup: float
    ideal: float
    efficiency: float
    phases: dict[str, float] = field(default_factory=dict)
    repeats: list[float] = field(default_factory=list)  # median ms per batch of each timing repeat


def scaling(kind: str, nprocs: Sequence[int], batch_ms: Sequence[float]) -> list[tuple]:
    """(speedup, ideal, efficiency) per member. Strong: T0/Tp against p/p0. Weak (scaled speedup):
    (p/p0) T0/Tp, efficiency T0/Tp, since each rank's work stays the same."""
    p0, t0 = nprocs[0], batch_ms[0]
    out = []
    for p, t in zip(nprocs, batch_ms):
        ideal = p / p0
        speedup = t0 / t if kind == "strong" else ideal * t0 / t
        out.append((speedup, ideal, speedup / ideal))
    return out


@dataclass
class Divergence:
    step: int
    why: str  # "NaN" or "loss rose past its start"


def divergence(loss: Sequence[tuple[int, float]]) -> Divergence | None:
    """NaN or infinity at any step, or a loss that ends above where it started."""
    for step, value in loss:
        if not math.isfinite(value):
            return Divergence(step, "loss is NaN" if value != value else "loss is infinite")
    if len(loss) < 2:
        return None
    start = loss[0][1]
    tail = [v for _s, v in loss[-max(1, len(loss) // 10) :]]
    if sum(tail) / len(tail) > start:
        first_above = next(s for s, v in loss[1:] if v > start)
        return Divergence(first_above, "loss rose past its start")
    return None


def steps_to_target(loss: Sequence[tuple[int, float]], target: float) -> int | None:
    """First step (1-based count of updates) whose loss is at or below target."""
    for step, value in loss:
        if value <= target:
            return step + 1
    return None


def common_target(losses: Sequence[Sequence[tuple[int, float]]]) -> float | None:
    """The lowest loss every curve reaches: the highest of their minima."""
    minima = [min(v for _s, v in loss) for loss in losses if loss]
    return max(minima) if minima else None


@dataclass
class Regime:
    lo: int  # batch sizes bounding the segment
    hi: int
    slope: float  # d log(steps) / d log(batch size): -1 is perfect scaling
    name: str


def regimes(batch_sizes: Sequence[int], steps: Sequence[int]) -> list[Regime]:
    """Each step between consecutive batch sizes, labelled by its slope."""
    out = []
    for (b0, s0), (b1, s1) in zip(zip(batch_sizes, steps), list(zip(batch_sizes, steps))[1:]):
        slope = math.log(s1 / s0) / math.log(b1 / b0)
        if slope <= PERFECT_SLOPE:
            name = "perfect scaling"
        elif slope < MAXIMAL_SLOPE:
            name = "diminishing returns"
        else:
            name = "maximal data parallelism"
        out.append(Regime(b0, b1, slope, name))
    return out


def best(values: Sequence[float | None], higher: bool = True) -> int | None:
    """Index of the best finite value."""
    ok = [(v, i) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    if not ok:
        return None
    return (max(ok) if higher else min(ok))[1]


def point_batch_ms(p: Any) -> float:
    """A point's ms per batch: the median of its timing repeats' medians when it has several
    (``perf.repeats``; a short run's one median can be 2x off on a noisy machine), else its median."""
    from trainer import metrics

    if len(p.batch_ms_repeats) > 1:
        return statistics.median(p.batch_ms_repeats)
    return p.metrics.get(metrics.phase_time("batch"), math.nan)


def family_rows(points: Sequence[Any], family: Family) -> list[Scaling]:
    """The family's scaling figures from its points' own timings (``study.Point``s, by index)."""
    from trainer import metrics

    members = [points[i] for i in family.members]
    batch = [point_batch_ms(p) for p in members]
    ratios = scaling(family.kind, [p.nproc for p in members], batch)
    rows = []
    for p, t, (speedup, ideal, eff) in zip(members, batch, ratios):
        q1 = p.metrics.get(metrics.phase_quantile("batch", "q1"), t)
        q3 = p.metrics.get(metrics.phase_quantile("batch", "q3"), t)
        phases = {ph: p.metrics.get(metrics.phase_time(ph), 0.0) for ph in metrics.PHASES if ph != "batch"}
        # The run's samples/s at the time chosen above (its global batch over that time).
        run_ms = p.metrics.get(metrics.phase_time("batch"), math.nan)
        samples = p.metrics.get(metrics.SAMPLES_PER_S, math.nan) * run_ms / t
        rows.append(Scaling(p.nproc, t, q1, q3, samples, speedup, ideal, eff, phases, p.batch_ms_repeats))
    return rows
