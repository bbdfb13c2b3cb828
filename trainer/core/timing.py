"""The timing protocol: which timed batches a run's figures come from, and what they say. Pure.

A run's batch times (trainer/core/clock.py, one sample a batch and phase) become its figures so:

- **Warm-up left out**: the first epoch (cuBLAS's heuristics, NCCL's first sums, the CUDA graphs'
  capture: trainer/gpu/graphs.py), and at least ``warmup`` batches.
- **A floor**: the batches left are cut into ``repeats`` consecutive runs, each at least
  ``min_batches`` batches and ``min_seconds`` long. A run with fewer batches times extra steps
  after training, on a scratch copy of its weights (trainer/lifecycle/timing_pass.py): its own
  weights never change for it.
- **A median and an interval**: each repeat's median; the point's time is their median, its
  interval their range. Two times whose intervals overlap are the same within noise.
- **The sum split**: a rank's ``allreduce`` phase holds the sum itself and its wait for the slowest
  rank. The rank that arrives last waits for no one, so per batch the sum itself is the least
  ``allreduce`` time over the ranks; rank 0's wait is its own time less that, and the skew the
  largest wait of any rank.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from trainer import metrics


@dataclass(frozen=True)
class Protocol:
    repeats: int = 3
    warmup: int = 2
    min_batches: int = 10
    min_seconds: float = 0.05

    def skipped(self, batches_per_epoch: int) -> int:
        """Batches left out at a timing's start: the first epoch, and at least ``warmup``."""
        return max(self.warmup, batches_per_epoch)

    def needed(self, batch_ms: float) -> int:
        """Batches the timed sample needs at ``batch_ms`` a batch: ``repeats`` runs of the floor."""
        per_second = math.ceil(self.min_seconds * 1e3 / batch_ms) if batch_ms > 0 else 0
        return self.repeats * max(self.min_batches, per_second)

    def enough(self, batch_ms: Sequence[float]) -> bool:
        """Whether these timed batches meet the floor for every repeat."""
        n = len(batch_ms)
        return n >= self.repeats * self.min_batches and sum(batch_ms) >= self.repeats * self.min_seconds * 1e3


def blocks(n: int, repeats: int) -> list[slice]:
    """``n`` batches cut into ``repeats`` consecutive runs of sizes differing by at most one."""
    k = max(1, min(repeats, n))
    base, extra = divmod(n, k)
    out, lo = [], 0
    for r in range(k):
        hi = lo + base + (r < extra)
        out.append(slice(lo, hi))
        lo = hi
    return out


@dataclass
class Measured:
    """A run's timing figures, milliseconds a batch."""

    phases: dict[str, float]  # each phase's median over the timed batches ("batch": the whole batch)
    quartiles: dict[str, dict[str, float]]  # {"q1": {phase: ms}, "q3": ...}
    repeats: list[float]  # each repeat's median batch time
    batches: int  # batches timed
    extra: int = 0  # of which steps timed after training, on a scratch copy of the weights
    split: dict[str, float] = field(default_factory=dict)  # sum, wait, skew: medians (several ranks)

    @property
    def batch_ms(self) -> float:
        """The point's time a batch: the median of its repeats' medians."""
        return statistics.median(self.repeats)

    @property
    def interval(self) -> tuple[float, float]:
        """The range of the repeats' medians."""
        return min(self.repeats), max(self.repeats)


def measure(samples: dict[str, Sequence[float]], repeats: int, extra: int = 0) -> Measured:
    """The figures of the timed batches ``samples`` (phase -> ms per batch, all of one length)."""
    batch = list(samples["batch"])
    if not batch:
        raise ValueError("no timed batch: the timing protocol needs at least one")
    medians = {p: float(np.median(v)) for p, v in samples.items() if len(v)}
    quartiles = {
        which: {p: float(np.quantile(v, q)) for p, v in samples.items() if len(v)}
        for which, q in metrics.QUANTILES.items()
    }
    per_repeat = [float(np.median(batch[s])) for s in blocks(len(batch), repeats)]
    return Measured(medians, quartiles, per_repeat, len(batch), extra)


def split_sum(allreduce_ms: np.ndarray) -> dict[str, np.ndarray]:
    """Per batch, from every rank's ``allreduce`` times (ranks x batches; row 0: rank 0): the sum
    itself (the least over the ranks), rank 0's wait for the slowest rank, and the skew (the
    largest wait of any rank)."""
    a = np.asarray(allreduce_ms, dtype=float)
    least = a.min(axis=0)
    return {"sum": least, "wait": a[0] - least, "skew": a.max(axis=0) - least}
