"""A search's own figure (hydra/sweeper=search, sweeper/search.py): its objective by trial with the
best so far, and against each searched value, a colour per nproc. Read from the runs alone: each
trial's run carries its trial number (tag), the parent run what was searched towards what."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.ticker import NullFormatter

from sweeper.report.plotting import fmt, grid, palette, save, use_log
from sweeper.report.study import Point
from trainer import metrics


def trials(points: Sequence[Point], objective: str) -> list[tuple[int, float, Point]]:
    """(trial number, objective, point) of every finished trial that recorded the objective, in trial order."""
    out = []
    for p in points:
        number, value = p.tags.get(metrics.TAG_TRIAL), p.metrics.get(objective)
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
    and each key's importance where the search found it. ``search``: the parent's tag (sweeper/search.py)."""
    objective, direction, importance = search["objective"], search["direction"], search.get("importance", {})
    rows = trials(points, objective)
    if not rows:
        return f"no finished trial recorded {objective}"
    keys = [k for k in search["searched"] if k != "nproc"] or ["nproc"]
    nprocs = [p.nproc for _n, _v, p in rows]
    colours = palette(nprocs)
    fig, ax = grid(1, 1 + len(keys) + bool(importance), width=4.4)
    left = ax[0][0]
    for n, v, p in rows:
        left.plot([n], [v], "o", color=colours[fmt(p.nproc)], label=f"nproc={p.nproc}")
    numbers, values = [n for n, _v, _p in rows], [v for _n, v, _p in rows]
    left.step(numbers, best_so_far(values, direction == "maximize"), where="post", color="black", label="best so far")
    left.set(xlabel="trial", ylabel=objective, title=f"{objective} by trial ({direction})")
    for a, key in zip(ax[0][1 : 1 + len(keys)], keys):
        xs = [p.get(key) for _n, _v, p in rows]
        for x, (_n, v, p) in zip(xs, rows):
            a.plot([x], [v], "o", color=colours[fmt(p.nproc)])
        if use_log(key, xs):
            a.set_xscale("log")
            a.xaxis.set_minor_formatter(NullFormatter())  # decades labelled; minor labels overlap
        a.set(xlabel=key, ylabel=objective, title=f"{objective} against {key}")
    if importance:  # Optuna's fANOVA: each key's share of the objective's variance
        a = ax[0][-1]
        ordered = sorted(importance.items(), key=lambda kv: kv[1])
        a.barh([k for k, _ in ordered], [v for _, v in ordered], color="grey")
        a.set(xlabel="importance (share of the variance)", title="What mattered", xlim=(0, 1))
    handles, labels = left.get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    left.legend(seen.values(), seen.keys(), fontsize=7, loc="best")
    fig.suptitle(f"Search: {len(rows)} finished trial(s)")
    return save(fig, out)
