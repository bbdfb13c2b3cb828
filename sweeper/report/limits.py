"""What limits a scaling family's speedup, in words, from the phases its points measured. Pure.

A batch on ``p`` ranks takes each rank's own work (the loop's phases but the sum: trainer/core/loop.py),
the sum itself and the wait for the slowest rank (trainer/core/timing.py). Against the ideal (the
baseline's time over p / p0 in strong scaling, the baseline's time in weak), the time lost is the sum,
the wait, and whatever of a rank's own work did not shrink with its rows; the largest names the limit.
On the GPU the CPU's time to queue a batch says whether the launches set the pace instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sweeper.report.families import Family, Scaling

LAUNCH_BOUND = 0.9  # the CPU's time to queue a batch at this share of the batch: the GPU waits for its launches
_WAIT = "the wait"  # for the slowest rank, in the sum
IDEAL_WITHIN = 0.9  # an efficiency interval from here to past 1: ideal within the noise; wider: too noisy to say


def rows_per_rank(family: Family, nproc: int) -> float | None:
    """A rank's rows of a batch at ``nproc`` (the family fixes the global batch or the rows per rank)."""
    if family.kind == "weak":
        return family.fixed.get("rows per rank")
    batch = family.fixed.get("batch_size")
    return batch / nproc if isinstance(batch, (int, float)) else None


def limit(family: Family, rows: Sequence[Scaling]) -> str:
    """One sentence: at the family's most ranks, what each rank computes and in how long, what the sum
    and the wait cost, what limits the speedup, which nproc is fastest and where scaling would pay."""
    base, last = rows[0], rows[-1]
    if not (said := cause(family, rows)):
        return ""  # no phases, or timings slowed by others (the flags say so): nothing to name
    lost = _lost(family, base, last)
    n, n0 = rows_per_rank(family, last.nproc), rows_per_rank(family, base.nproc)
    work = f"{n:g} rows" if n else "its rows"
    noisy = last.efficiency_hi >= 1 and last.efficiency_lo < IDEAL_WITHIN
    text = (
        f"at nproc={last.nproc} a rank computes {work} in {last.compute_ms:.3g} ms"
        + (f" (nproc={base.nproc}: {n0:g} in {base.compute_ms:.3g} ms)" if n0 else "")
        + f", sums in {last.sum_ms:.3g} ms and waits {lost[_WAIT]:.3g} ms for the slowest rank: {said}"
    )
    verdict = _verdict(family, base, last)
    text += f"; {verdict}" if verdict else ""
    overhead = lost["the sum"] + lost[_WAIT]
    batch = family.fixed.get("batch_size")
    if family.kind == "strong" and isinstance(batch, (int, float)) and 0 < last.compute_ms < overhead and not noisy:
        pays = batch * overhead / last.compute_ms  # a rank's work grows with its rows until it matches the sum
        text += (
            f" (scaling would pay from a batch of about {math.ceil(pays / 100) * 100:,}, where a rank's work "
            "would match the sum and the wait)"
        )
    return text


def cause(family: Family, rows: Sequence[Scaling], brief: bool = False) -> str:
    """What limits the family's speedup at its most ranks, as a clause ("the sum limits the speedup"),
    or that nothing is lost within the noise; "" where its phases or trusted timings are missing.
    ``brief``: without the launches' figures."""
    base, last = rows[0], rows[-1]
    if len(rows) < 2 or not last.phases or not base.phases or not (base.trusted and last.trusted):
        return ""
    if last.efficiency_lo >= 1:  # faster than ideal beyond the noise: nothing lost (the flags weigh it)
        return "no time is lost against the ideal"
    if last.efficiency_hi >= 1:  # nothing lost beyond the noise: no limit to name
        noisy = last.efficiency_lo < IDEAL_WITHIN
        return (
            "its timing noise is too wide to name a limit" if noisy else "the speedup is ideal within the timing noise"
        )
    lost = _lost(family, base, last)
    what = max(lost, key=lambda k: lost[k])
    queue = last.phases.get("queue", 0.0)
    if queue >= LAUNCH_BOUND * last.batch_ms:
        what = "the launches" + (
            "" if brief else f" (the CPU took {queue:.3g} ms to queue a batch the GPU ran in {last.batch_ms:.3g} ms)"
        )
    return f"{what} limits the speedup"


def _lost(family: Family, base: Scaling, last: Scaling) -> dict[str, float]:
    """The ms a batch lost against the ideal at the most ranks, by what lost it."""
    share = base.nproc / last.nproc if family.kind == "strong" else 1.0
    return {
        "the sum": last.sum_ms,
        _WAIT: last.phases.get("wait", 0.0),
        "a rank's work, which did not shrink with its rows,": max(0.0, last.compute_ms - base.compute_ms * share),
    }


def _verdict(family: Family, base: Scaling, last: Scaling) -> str:
    """Whether the most ranks pay, beyond the timing noise (their speedup's interval)."""
    p, p0, s = last.nproc, base.nproc, last.speedup
    if family.kind == "strong":
        said = (f"nproc={p} is {s:.2f}x faster", f"nproc={p0} is fastest", f"nproc={p} is no faster than nproc={p0}")
    else:
        said = (
            f"nproc={p} gives {s:.2f}x the samples/s of nproc={p0}",
            f"nproc={p0} gives the most samples/s",
            f"nproc={p} gives no more samples/s than nproc={p0}",
        )
    if last.speedup_lo > 1:
        return said[0]
    if last.speedup_hi < 1:
        return said[1]
    # Within the noise: the strong family's flags say so (families.flags).
    return "" if family.kind == "strong" else said[2] + " within the timing noise"
