"""Convergence figures: loss curves, precision, final values against each axis, weight error.

The course's figures (002, figures 3-10): loss against iterations by learning rate, precision
against hidden size and epochs, and the CPU-vs-GPU weight error growing with the learning rate
and the epochs (training is chaotic: rounding differences grow, 002 Q1.2).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from sweeper.report import analysis
from sweeper.report.plotting import finite_max, fmt, grid, key_legend, palette, save, use_log
from sweeper.report.study import Point
from trainer import metrics

STYLES = ("-", "--", ":", "-.")


def convergence_axes(axis: list[str]) -> list[str]:
    """The axes that can change convergence first: nproc changes only the summation order."""
    return [k for k in axis if k != "nproc"] + [k for k in axis if k == "nproc"]


def _keys(axis: list[str]) -> tuple[str | None, str | None]:
    """Colour by the first axis, panels by the second."""
    axis = convergence_axes(axis)
    return (axis[0] if axis else None), (axis[1] if len(axis) > 1 else None)


MAX_PANELS = 4  # a row of panels per value up to this many; a search's continuous values take colours


def _colour_and_panel(points: list[Point], axis: list[str]) -> tuple[str | None, str | None]:
    """:func:`_keys`, but an axis of many values (a search's lr) is coloured (a colour bar), not
    given a row of panels each; where both have many, no panels."""
    colour_key, panel_key = _keys(axis)
    many = {k: len({fmt(p.get(k)) for p in points}) > MAX_PANELS for k in (colour_key, panel_key) if k}
    if panel_key and many[panel_key]:
        return (panel_key, colour_key) if colour_key and not many[colour_key] else (colour_key, None)
    return colour_key, panel_key


def _style_key(axis: list[str]) -> str | None:
    """Line style by a third axis (e.g. nproc, whose curves lie on each other)."""
    axis = convergence_axes(axis)
    return axis[2] if len(axis) > 2 else None


def _log_if_wide(a: Any, values: list[float]) -> None:
    ok = [v for v in values if v is not None and 0 < v < float("inf")]
    if ok and max(ok) / min(ok) > 5:
        a.set_yscale("log")


def _label(p: Point, key: str | None) -> str:
    return f"{key}={fmt(p.get(key))}" if key else p.name


def _wall_time(p: Point) -> list[tuple[float, float]]:
    """(seconds since training started, loss): each epoch's batches spread evenly over its time."""
    per_epoch: dict[int, list[tuple[int, float]]] = {}
    n_batches = max(1, len(p.loss) // max(1, len(p.epoch_s)))
    for i, (step, value) in enumerate(p.loss):
        per_epoch.setdefault(i // n_batches + 1, []).append((step, value))
    out, t0 = [], 0.0
    for epoch, seconds in p.epoch_s:
        rows = per_epoch.get(epoch, [])
        out += [(t0 + seconds * (j + 1) / len(rows), v) for j, (_s, v) in enumerate(rows)]
        t0 += seconds
    return out


def _samples_seen(p: Point) -> list[tuple[float, float]]:
    """(samples trained on, loss) after each step: whole epochs of N plus this epoch's batches."""
    batch = p.get("batch_size", 1)
    n = p.metrics.get(metrics.N_TRAIN)
    if not n:  # a run recorded before data/n_train: full batches
        return [((s + 1) * batch, v) for s, v in p.loss]
    per_epoch = -(-int(n) // batch)
    return [((s // per_epoch) * n + min((s % per_epoch + 1) * batch, n), v) for s, v in p.loss]


def loss_curves(points: list[Point], axis: list[str], out: Path) -> Path:
    """Loss against step, samples seen and wall time; one line per point, every point."""
    return save(loss_figure(points, axis), out)


def loss_figure(points: list[Point], axis: list[str]) -> Any:
    """The figure of :func:`loss_curves`, drawn: a positive axis (logarithmic where the losses span
    more than 5x), diverged curves cut at the healthy ones' start and marked where they diverged."""
    colour_key, panel_key = _colour_and_panel(points, axis)
    style_key = _style_key(axis)
    styles = {fmt(v): STYLES[i % len(STYLES)] for i, v in enumerate(dict.fromkeys(p.get(style_key) for p in points))}
    panels = list(dict.fromkeys(fmt(p.get(panel_key)) for p in points)) if panel_key else [""]
    colours = palette([p.get(colour_key) if colour_key else p.name for p in points])
    fig, ax = grid(len(panels), 3)
    healthy = [v for p in points if not p.diverged for _s, v in p.loss[:1]]
    top = 1.15 * finite_max(healthy) if healthy else None
    for p in points:
        row = panels.index(fmt(p.get(panel_key))) if panel_key else 0
        colour = colours[fmt(p.get(colour_key)) if colour_key else p.name]
        bad = p.diverged
        label = _label(p, colour_key) + (f", {_label(p, style_key)}" if style_key else "")
        label += f" (diverged at step {bad.step}: {bad.why})" if bad else ""
        style = ":" if bad else styles[fmt(p.get(style_key))]
        series = [[(s, v) for s, v in p.loss], _samples_seen(p), _wall_time(p)]
        for col, xy in enumerate(series):
            if not xy:
                continue
            xs, ys = zip(*xy)
            a = ax[row][col]
            a.plot(xs, ys, color=colour, lw=1.2, ls=style, label=label if col == 0 else None)
            if bad:
                at = [(x, min(y, top) if top else y) for (s, _v), (x, y) in zip(p.loss, xy) if s == bad.step]
                if at:
                    a.plot(*at[0], marker="x", color=colour, ms=8, mew=2)
    healthy_losses = [v for p in points if not p.diverged for _s, v in p.loss]
    for row, panel in enumerate(panels):
        for col, xlabel in enumerate(("step (iteration)", "samples seen", "wall time (s)")):
            a = ax[row][col]
            a.set_xlabel(xlabel)
            a.set_ylabel("training loss")
            _log_if_wide(a, healthy_losses)
            if top:
                a.set_ylim(top=top)
            if a.get_yscale() == "linear":  # a loss is positive: no margin below 0
                a.set_ylim(bottom=0)
            if panel_key:
                a.set_title(f"{panel_key}={panel}")
    if colour_key:
        key_legend(fig, ax, ax[0][0], colour_key, [p.get(colour_key) for p in points])
    else:
        fig.legend(loc="outside right upper", fontsize=8)
    fig.suptitle("Convergence: training loss of every point")
    return fig


def precision_by_epoch(points: list[Point], axis: list[str], out: Path) -> Path:
    """Test precision and the epoch's mean training loss against epoch, one line per point."""
    from matplotlib import ticker

    colour_key, _ = _keys(axis)
    colours = palette([p.get(colour_key) if colour_key else p.name for p in points])
    fig, ax = grid(1, 2)
    for col, (series, ylabel) in enumerate(
        ((lambda p: p.precision, "test precision"), (lambda p: p.loss_epoch, "training loss (epoch mean)"))
    ):
        a = ax[0][col]
        for p in points:
            if series(p):
                xs, ys = zip(*series(p))
                colour = colours[fmt(p.get(colour_key)) if colour_key else p.name]
                a.plot(xs, ys, marker=".", color=colour, label=_label(p, colour_key))
        a.set(xlabel="epoch", ylabel=ylabel, title=f"{ylabel} by epoch")
        a.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        if col == 1:
            _log_if_wide(a, [v for p in points for _e, v in p.loss_epoch])
    if colour_key:
        key_legend(fig, ax, ax[0][0], colour_key, [p.get(colour_key) for p in points])
    fig.suptitle("Precision and loss by epoch")
    return save(fig, out)


def finals(points: list[Point], axis: list[str], out: Path) -> Path:
    """Final precision and loss against each axis, the study's best marked. A figure of its own,
    not a row under the epochs': the report's figures are drawn side by side, one a child."""
    shown = [k for k in axis if k != "nproc"] or list(axis) or [None]
    fig, ax = grid(len(shown), 2)
    last = {
        "final test precision": [_last(p.precision) for p in points],
        "final training loss": [_last(p.loss_epoch) for p in points],
    }
    top = analysis.best_point(points, lambda p: p.metrics.get(metrics.TEST_PRECISION))
    for k, key in enumerate(shown):
        for j, (what, values) in enumerate(last.items()):
            _against(ax[k][j], points, key, values, what, top)
    fig.suptitle("Final values, and the study's best point (starred: highest precision, not diverged)")
    return save(fig, out)


def _last(series: list[tuple[int, float]]) -> float | None:
    return series[-1][1] if series else None


def _against(a: Any, points: list[Point], key: str | None, values: list, what: str, top: Point | None) -> None:
    """Final value against one axis, one line per combination of the other axes; the study's best starred."""
    if key is None:
        a.bar([p.name for p in points], [v or 0 for v in values])
        a.set_title(what)
        return
    # One colour per value of the first other key and one line style per value of the second,
    # the same in every panel of the figure (the palette is of every point's value, not the panel's).
    others = [k for k in convergence_axes(sorted({k for p in points for k in p.config})) if k not in (key, "nproc")]
    others = [k for k in others if _varies(points, k)]
    colour_key, style_key = [*others, None, None][:2]
    colours = palette([p.get(colour_key) for p in points]) if colour_key else {}
    styles = {fmt(v): STYLES[i % len(STYLES)] for i, v in enumerate(dict.fromkeys(p.get(style_key) for p in points))}
    lines: dict[tuple, list[tuple[Any, float]]] = {}
    for p, v in zip(points, values):
        if v is not None and math.isfinite(v):
            lines.setdefault(tuple(fmt(p.get(k)) for k in others), []).append((p.get(key), v))
    for combo, xy in lines.items():
        xy.sort(key=lambda t: t[0])
        xs, ys = zip(*xy)
        colour = colours.get(combo[0]) if colour_key else None
        style = styles.get(combo[1], "-") if style_key else "-"
        label = ", ".join(f"{k}={v}" for k, v in zip(others, combo)) or None
        a.plot(xs, ys, marker="o", ms=4, color=colour, ls=style, label=label)
    bad = [(p.get(key), v) for p, v in zip(points, values) if p.diverged and v is not None and math.isfinite(v)]
    if bad:  # "too large": still drawn, marked
        a.plot(*zip(*bad), "x", color="firebrick", ms=9, mew=2, zorder=4, label="diverged")
    i = next((i for i, p in enumerate(points) if p is top and values[i] is not None), None)
    if i is not None:
        a.plot(
            points[i].get(key),
            values[i],
            marker="*",
            ms=16,
            color="gold",
            mec="black",
            zorder=5,
            label=f"best: {points[i].name}",
        )
    if use_log(key, [p.get(key) for p in points]):
        a.set_xscale("log")
    if what.endswith("loss"):
        _log_if_wide(a, [v for v in values if v is not None])
    a.set(xlabel=key, ylabel=what, title=f"{what} against {key}")
    a.legend(loc="best", fontsize=7)


def _varies(points: list[Point], key: str) -> bool:
    return len({repr(p.get(key)) for p in points}) > 1


def weight_error(points: list[Point], axis: list[str], out: Path) -> Path | str:
    """CPU-vs-GPU (or ranks-vs-sequential) weight error against lr and epochs, on a log axis; or why
    there is nothing to draw."""
    key = metrics.weight_error("max")
    checked = [p for p in points if key in p.metrics]
    if not checked:
        return "no point has its CPU check yet (check.reference=false, or the checks are pending)"
    if not any(p.metrics[key] > 0 for p in checked):  # a log axis of zeros says nothing
        return "the weight error is 0 at every point: each run equals its CPU reference bit for bit"
    against = [k for k in ("lr", "epochs") if k in axis] or axis[:1] or ["hidden"]
    fig, ax = grid(1, len(against))
    for a, k in zip(ax[0], against):
        others = [x for x in axis if x != k]
        colours = palette([p.get(others[0]) if others else "" for p in checked])
        floor = min(p.metrics[key] for p in checked if p.metrics[key] > 0) / 10  # where an exact 0 is drawn
        for p in sorted(checked, key=lambda p: (repr(p.get(others[0])) if others else "", p.get(k))):
            c = colours[fmt(p.get(others[0])) if others else ""]
            zero = p.metrics[key] == 0  # bit for bit: a hollow mark on the axis's floor, not a tiny value
            a.plot(
                p.get(k), floor if zero else p.metrics[key], "v" if zero else "o", color=c, mfc="none" if zero else c
            )
        if any(p.metrics[key] == 0 for p in checked):
            a.plot([], [], "v", color="grey", mfc="none", label="0: bit for bit")
        for v in dict.fromkeys(fmt(p.get(others[0])) for p in checked) if others else []:
            a.plot([], [], "o", color=colours[v], label=f"{others[0]}={v}")
        a.set_yscale("log")
        if use_log(k, [p.get(k) for p in checked]):
            a.set_xscale("log")
        a.set(xlabel=k, ylabel="max relative weight error", title=f"Weight error vs the CPU reference, by {k}")
        if others:
            a.legend(loc="best")
    fig.suptitle(_error_trend(checked, against[0], key))
    return save(fig, out)


def _error_trend(points: list[Point], k: str, key: str) -> str:
    """How the weight error moves with ``k``, from the points: its median at the smallest and the
    largest value of ``k``."""
    by_k: dict[Any, list[float]] = {}
    for p in points:
        by_k.setdefault(p.get(k), []).append(p.metrics[key])
    values = sorted((v for v in by_k if v is not None), key=lambda v: (isinstance(v, str), v))
    if len(values) < 2:
        return f"Weight error vs the CPU reference: {fmt(statistics.median(by_k[values[0]]) if values else 0)}"
    lo, hi = statistics.median(by_k[values[0]]), statistics.median(by_k[values[-1]])
    if hi > 3 * lo:
        how = "grows"
    elif lo > 3 * hi:
        how = "falls"
    else:
        how = "barely moves"
    return f"The weight error {how} with {k}: {lo:.2g} at {k}={fmt(values[0])}, {hi:.2g} at {k}={fmt(values[-1])}"
