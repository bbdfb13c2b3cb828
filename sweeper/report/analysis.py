"""What a study's points say, computed from their configs and records: pure, no I/O.

- the axes: config keys whose values differ between points, in the sweep's order;
- batch-size studies' regimes of data parallelism (the course's 004, after Shallue et
  al.): doubling the batch halves the steps to a target (perfect scaling), saves less
  (diminishing returns), or saves nothing (maximal data parallelism);
- divergence: a loss that turns NaN or rises past its start;
- time to a target precision, from a run's epochs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# The order in which axes colour and split figures when the sweep's own order is unknown.
AXIS_ORDER = ("lr", "hidden", "batch_size", "epochs", "nproc", "reg", "dtype", "seed")
# Slopes of log(steps to target) against log(batch size) that bound the regimes.
PERFECT_SLOPE, MAXIMAL_SLOPE = -0.75, -0.15


def seconds_to_target(
    precision: Sequence[tuple[int, float]], epoch_s: Sequence[tuple[int, float]], target: float
) -> float | None:
    """Training seconds to a test precision: the epochs' times up to the first epoch whose
    precision reached ``target`` (``(epoch, value)`` pairs each); None if none did."""
    seconds = dict(epoch_s)
    for epoch, value in sorted(precision):
        if value >= target:
            return sum(s for e, s in seconds.items() if e <= epoch)
    return None


def axes(configs: Sequence[dict[str, Any]], order: Sequence[str] = ()) -> list[str]:
    """Keys whose values differ between configs: the sweep's order first, then AXIS_ORDER, then by name."""
    keys = {k for c in configs for k in c}
    varying = [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]
    rank: dict[str, int] = {}
    for k in (*order, *AXIS_ORDER):
        rank.setdefault(k, len(rank))
    return sorted(varying, key=lambda k: (rank.get(k, len(rank)), k))


# A loss "rose past its start" when its last tenth's mean ends this fraction above its first value: a run
# that barely moves (lr=1e-4) wanders around its start by less, a diverging one leaves it far behind.
RISE_TOLERANCE = 0.05


@dataclass
class Divergence:
    step: int
    why: str  # "loss is NaN", "loss is infinite" or "loss rose 5% past its start"


def divergence(loss: Sequence[tuple[int, float]]) -> Divergence | None:
    """NaN or infinity at any step, or a loss whose last tenth ends RISE_TOLERANCE above its start."""
    for step, value in loss:
        if not math.isfinite(value):
            return Divergence(step, "loss is NaN" if value != value else "loss is infinite")
    if len(loss) < 2:
        return None
    limit = loss[0][1] * (1 + RISE_TOLERANCE)
    tail = [v for _s, v in loss[-max(1, len(loss) // 10) :]]
    if sum(tail) / len(tail) > limit:
        first_above = next(s for s, v in loss[1:] if v > limit)
        return Divergence(first_above, f"loss rose {RISE_TOLERANCE:.0%} past its start")
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


TIE = 0.001  # test precisions closer than this (10 of 10,000 test images) are a tie, not a ranking


def best_point(points: Sequence[Any], precision: Callable[[Any], float | None]) -> Any | None:
    """The study's one best point, everywhere it is named: among the finished points that did not
    diverge, the cheapest (fewest ranks, then the narrowest hidden layer) of those within ``TIE`` of
    the highest final precision: the same result for less."""
    ok = []
    for i, p in enumerate(points):
        v = precision(p) if p.status == "FINISHED" and not p.diverged else None
        if v is not None and math.isfinite(v):
            ok.append((v, i, p))
    if not ok:
        return None
    top = max(v for v, _i, _p in ok)
    cheapest = min(
        (t for t in ok if t[0] >= top - TIE), key=lambda t: (t[2].nproc, t[2].get("hidden") or 0, -t[0], t[1])
    )
    return cheapest[2]


def tied_with(best: Any, points: Sequence[Any], precision: Callable[[Any], float | None]) -> list[Any]:
    """The other finished points within ``TIE`` of the best's precision, which the best was chosen over
    for being cheaper (or for its precision)."""
    v = precision(best)
    return [
        p
        for p in points
        if p is not best and p.status == "FINISHED" and not p.diverged
        and (w := precision(p)) is not None and math.isfinite(w) and abs(w - v) <= TIE
    ]  # fmt: skip
