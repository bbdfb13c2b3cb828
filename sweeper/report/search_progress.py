"""A search's own figure (hydra/sweeper=search, sweeper/search/study.py): its objective by trial with the
best so far, and against each searched value, a colour per nproc. Read from the runs alone: each
trial's run carries its trial number (tag), the parent run what was searched towards what."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sweeper.report.analysis import seconds_to_target
from sweeper.report.plotting import fmt, grid, palette, save, use_log
from sweeper.report.study import Point
from trainer import metrics


def trials(points: Sequence[Point], objective: str, target: float | None = None) -> list[tuple[int, float, Point]]:
    """(trial number, objective, point) of every finished trial that has the objective, in trial
    order; objective time_to_target: its training seconds to ``target``, infinity if never reached."""
    out = []
    for p in points:
        number, value = p.tags.get(metrics.TAG_TRIAL), p.metrics.get(objective)
        if objective == metrics.TIME_TO_TARGET and target is not None:
            value = seconds_to_target(p.precision, p.epoch_s, target)
            value = math.inf if value is None else value
        if number is not None and value is not None and p.status == "FINISHED":
            out.append((int(number), float(value), p))
    return sorted(out, key=lambda t: t[0])


def best_so_far(values: Sequence[float], maximize: bool) -> list[float]:
    out: list[float] = []
    for v in values:
        out.append(v if not out else (max if maximize else min)(out[-1], v))
    return out


def figure(points: Sequence[Point], search: dict[str, Any], out: Path) -> Path | str:
    """Objective by trial (best so far as a step line), the objective against each searched key,
    and each key's importance where the search found it. ``search``: the parent's tag (sweeper/search/study.py)."""
    from matplotlib import ticker

    objective, direction, importance = search["objective"], search["direction"], search.get("importance", {})
    rows = trials(points, objective, search.get("target"))
    if not rows:
        return f"no finished trial recorded {objective}"
    reached = [v for _n, v, _p in rows if math.isfinite(v)]
    ceiling = (max(reached) if reached else 1.0) * 1.15  # where a target never reached is drawn
    if objective == metrics.TIME_TO_TARGET:
        objective = f"seconds to precision {search['target']:g}"
    missed = {n for n, v, _p in rows if not math.isfinite(v)}
    best = best_so_far([v for _n, v, _p in rows], direction == "maximize")
    rows = [(n, v if math.isfinite(v) else ceiling, p) for n, v, p in rows]
    keys = [k for k in search["searched"] if k != "nproc"] or ["nproc"]
    nprocs = [p.nproc for _n, _v, p in rows]
    colours = palette(nprocs)
    fig, ax = grid(1, 1 + len(keys) + bool(importance), width=4.4)
    left = ax[0][0]
    for n, v, p in rows:
        marker = "x" if n in missed else "o"
        left.plot([n], [v], marker, color=colours[fmt(p.nproc)], label=f"nproc={p.nproc}")
    if missed:
        left.annotate("x: not reached", (0.02, 0.97), xycoords="axes fraction", va="top", fontsize=7)
    numbers = [n for n, _v, _p in rows]
    left.step(numbers, [min(b, ceiling) for b in best], where="post", color="black", label="best so far")
    left.set(xlabel="trial", ylabel=objective, title=f"{objective} by trial ({direction})")
    for a, key in zip(ax[0][1 : 1 + len(keys)], keys):
        xs = [p.get(key) for _n, _v, p in rows]
        for x, (n, v, p) in zip(xs, rows):
            a.plot([x], [v], "x" if n in missed else "o", color=colours[fmt(p.nproc)])
        if key in search.get("log", ()) or use_log(key, xs):  # sampled on a log scale, or spread over decades
            a.set_xscale("log")
            a.xaxis.set_minor_formatter(ticker.NullFormatter())  # decades labelled; minor labels overlap
        a.set(xlabel=key, ylabel=objective, title=f"{objective} against {key}")
    if importance:  # Optuna's fANOVA: each key's share of the objective's variance
        a = ax[0][-1]
        ordered = sorted(importance.items(), key=lambda kv: kv[1])
        a.barh([k for k, _ in ordered], [v for _, v in ordered], color="grey")
        a.set(xlabel="importance (share of the variance)", title="What mattered", xlim=(0, 1))
    handles, labels = left.get_legend_handles_labels()
    seen: dict[str, Any] = {}
    for handle, label in zip(handles, labels):
        seen.setdefault(label, handle)  # each nproc's first marker: a dot, not a target's miss
    left.legend(seen.values(), seen.keys(), fontsize=7, loc="best")
    fig.suptitle(f"Search: {len(rows)} finished trial(s)")
    return save(fig, out)
