"""The study's findings in words, computed from its numbers: what a reader should take away before
any figure. Pure: points and scaling rows in, sentences out (the report and the parent's summary
open with them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sweeper.report import analysis, limits
from sweeper.report import families as fam_mod
from sweeper.report.plotting import fmt
from trainer import metrics

SAME_RESULT = 0.005  # precision differences below half a percentage point: nproc did not change the result


def timing_study(points: Sequence[Any]) -> bool:
    """A study whose points were all timed alone (perf.timing=exclusive): it is about speed, and its
    precision (the scaling preset's one epoch at lr=1e-4) is not a result to headline."""
    # The points' own config, not the timing tags a retiming alone gives them (study.timed_again).
    return bool(points) and all(
        (p.get("perf.timing") or p.tags.get(metrics.TAG_TIMING_POLICY)) == "exclusive" for p in points
    )


def _name(p: Any, axis: Sequence[str], nproc: bool = False) -> str:
    """The point by the axes that set it apart (nproc left out where the result does not depend on it)."""
    shown = [k for k in axis if nproc or k != "nproc"] or list(axis)
    return ", ".join(f"{k}={fmt(p.get(k))}" for k in shown) or p.name


def findings(points: Sequence[Any], axis: Sequence[str], best: Any | None, fams: Sequence[tuple]) -> list[str]:
    """Sentences: the best point, what diverged or failed, whether nproc changed the result, the scaling
    verdict. ``points`` in the report's order: ``fams`` index its finished ones."""
    return _results(points, axis, best, fams) + _scaling_verdict(fams)


def brief(points: Sequence[Any], axis: Sequence[str], best: Any | None, fams: Sequence[tuple]) -> list[str]:
    """The findings as a terminal shows them: the same results, and a line per scaling family (its
    speedup, what limits it, whether to trust it); the report holds each whole."""
    out = _results(points, axis, best, fams)
    for fam, rows in fams:
        last = rows[-1]
        what = "speedup" if fam.kind == "strong" else "scaled speedup"
        said = [limits.cause(fam, rows, brief=True)]
        said += ["not to be trusted (other work shared its timings)"] if not all(r.trusted for r in rows) else []
        said = "; ".join(s for s in said if s)
        out.append(
            f"{fam.kind.capitalize()} scaling, {fam.label}: {what} {last.speedup:.2f}x at nproc={last.nproc} "
            f"({last.efficiency:.0%} efficiency)" + (f": {said}" if said else "") + "."
        )
    return out


def _results(points: Sequence[Any], axis: Sequence[str], best: Any | None, fams: Sequence[tuple]) -> list[str]:
    """The best point, what diverged, failed or was pruned, and whether nproc changed the result."""
    finished = [p for p in points if p.status == "FINISHED"]
    out = []
    pruned = [p for p in points if p.status == "KILLED" and metrics.TAG_STOPPED in p.tags]
    failed = [p for p in points if p.status != "FINISHED" and p not in pruned]
    if best is not None and not timing_study(finished):
        loss = f", final loss {best.loss_epoch[-1][1]:.4f}" if best.loss_epoch else ""
        ties = analysis.tied_with(best, finished, lambda p: p.metrics.get(metrics.TEST_PRECISION))
        tied = (
            f"; tied within {analysis.TIE} with {', '.join(_name(p, axis, nproc=True) for p in ties)}, "
            "it is the cheapest (fewest ranks, then the narrowest layer)"
            if ties
            else ""
        )
        out.append(
            f"Best: {_name(best, axis, nproc=bool(ties))} reaches test precision "
            f"{best.metrics[metrics.TEST_PRECISION]:.4f}{loss} "
            f"(of {len(finished)} finished point(s); diverged points never count{tied})."
        )
    bad = [p for p in finished if p.diverged]
    if bad:
        names = "; ".join(f"{_name(p, axis, nproc=True)} ({p.diverged.why} at step {p.diverged.step})" for p in bad)
        out.append(f"Diverged: {names}.")
    elif finished:
        out.append("No point diverged.")
    if failed:
        out.append(f"Failed or stopped: {', '.join(f'{p.name} ({p.status})' for p in failed)}.")
    if pruned:
        out.append(f"Pruned by the search between epochs (their runs KILLED): {', '.join(p.name for p in pruned)}.")
    return out + _nproc_effect(finished, fams)


def _nproc_effect(points: Sequence[Any], fams: Sequence[tuple]) -> list[str]:
    """Data-parallel SGD computes the same steps on any nproc: its precision should not move."""
    spreads = []
    for fam, _rows in fams:
        if fam.kind != "strong":
            continue
        by_rest: dict[tuple, list[float]] = {}
        for i in fam.members:
            p = points[i]
            v = p.metrics.get(metrics.TEST_PRECISION)
            if v is not None and math.isfinite(v) and not p.diverged:  # chaos, not nproc, sets a diverged run's
                key = tuple(sorted((k, repr(x)) for k, x in p.config.items() if k != "nproc"))
                by_rest.setdefault(key, []).append(v)
        spreads += [max(vs) - min(vs) for vs in by_rest.values() if len(vs) > 1]
    if not spreads:
        return []
    worst = max(spreads)
    if worst < SAME_RESULT:
        return [f"nproc did not change the result: precision within {worst:.4f} across nproc (the same SGD steps)."]
    return [
        f"Precision differs by up to {worst:.4f} between points that differ only in nproc: their sums run in "
        "another order, and rounding differences grow over training (the weight error says how far)."
    ]


def _scaling_verdict(fams: Sequence[tuple]) -> list[str]:
    """Per family: the speedup at its most ranks with its interval, what limits it, and the flags."""
    out = []
    for fam, rows in fams:
        last = rows[-1]
        what = "speedup" if fam.kind == "strong" else "scaled speedup"
        text = (
            f"{fam.kind.capitalize()} scaling, {fam.label}: {what} {last.speedup:.2f}x "
            f"({_range(last.speedup_lo, last.speedup_hi, '.2f')}x) at nproc={last.nproc} ({last.efficiency:.0%} "
            f"efficiency, {_range(last.efficiency_lo, last.efficiency_hi, '.0%')}, against nproc={rows[0].nproc})"
        )
        said = [limits.limit(fam, rows), *fam_mod.flags(fam, rows)]
        said = [s for s in said if s]
        out.append(text + (": " + "; ".join(said) if said else "") + ".")
    return out


def _range(lo: float, hi: float, spec: str) -> str:
    """An interval as the findings write it: 1.62-1.75 (no interval recorded: the value's own)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "no interval"
    return f"{lo:{spec}}-{hi:{spec}}"
