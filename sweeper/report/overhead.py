"""What a sweep cost around its training: pure, no I/O.

Per sweep (parent run): its wall time (parent start to end), the sum over the points it ran of
their time in the run (child start to end) and of their training (``time/epoch_s`` summed over
epochs), and the overhead per point, (wall - sum of training) / points. Points that run side by
side (several ranks' worth of cores, warm workers) make the sum of training exceed the wall time:
the overhead is then negative, and says only that the sweep ran points in parallel.
Also: the median time to the first batch (runs that logged it), warm and cold points, workers.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainer import metrics


@dataclass
class Overhead:
    """One sweep's time around its points' training, in seconds."""

    sweep_id: str
    wall_s: float  # parent run start to end (to now while it runs)
    points: int  # points this sweep ran (a reused run ran in an earlier sweep)
    in_run_s: float  # sum of child run start to end
    training_s: float  # sum of every epoch's time/epoch_s
    first_batch_s: float | None  # median time/to_first_batch_s; None when no run logged it
    warm: int
    cold: int
    workers: int  # distinct sweepscale.worker tags of the warm points

    @property
    def per_point_s(self) -> float | None:
        """(wall - sum of training) / points: negative when points ran side by side."""
        return (self.wall_s - self.training_s) / self.points if self.points else None

    def row(self) -> dict[str, Any]:
        """The CSV's and the page's row: names as the columns say them."""
        return {
            "sweep": self.sweep_id,
            "wall_s": round(self.wall_s, 3),
            "points": self.points,
            "in_run_s": round(self.in_run_s, 3),
            "training_s": round(self.training_s, 3),
            "overhead_per_point_s": _round(self.per_point_s),
            "first_batch_median_s": _round(self.first_batch_s),
            "warm": self.warm,
            "cold": self.cold,
            "workers": self.workers,
        }


def _round(value: float | None) -> float | str:
    return "" if value is None else round(value, 3)


def in_run_s(run: Any) -> float:
    """A run's span in MLflow (0 when it has no end: its process died before it could say)."""
    return (run.end_ms - run.start_ms) / 1e3 if run.start_ms is not None and run.end_ms is not None else 0.0


def training_s(run: Any) -> float:
    return sum(v for _e, v in run.epoch_s)


def is_warm(run: Any) -> bool:
    """Tagged warm; an untagged run is an older one, which always had a process of its own."""
    return run.tags.get(metrics.TAG_WARM, "false").lower() == "true"


def overhead(sweep: Any, runs: Sequence[Any], now_ms: float | None = None) -> Overhead:
    """One sweep's overhead from its parent (``study.Sweep``) and the runs it ran (``study.Point``s)."""
    now_ms = time.time() * 1000 if now_ms is None else now_ms
    wall = ((sweep.end_ms if sweep.end_ms is not None else now_ms) - sweep.start_ms) / 1e3
    firsts = [r.metrics[metrics.TIME_TO_FIRST_BATCH] for r in runs if metrics.TIME_TO_FIRST_BATCH in r.metrics]
    warm = [r for r in runs if is_warm(r)]
    return Overhead(
        sweep_id=sweep.sweep_id,
        wall_s=wall,
        points=len(runs),
        in_run_s=sum(in_run_s(r) for r in runs),
        training_s=sum(training_s(r) for r in runs),
        first_batch_s=statistics.median(firsts) if firsts else None,
        warm=len(warm),
        cold=len(runs) - len(warm),
        workers=len({r.tags[metrics.TAG_WORKER] for r in warm if r.tags.get(metrics.TAG_WORKER)}),
    )


def per_sweep(sweeps: Sequence[Any], runs: Sequence[Any], now_ms: float | None = None) -> list[Overhead]:
    """Each sweep's overhead over the runs it ran itself (by sweep id; reused runs excluded)."""
    return [overhead(s, [r for r in runs if r.sweep_id == s.sweep_id and not r.reused], now_ms) for s in sweeps]
