"""What every figure of the report shares: the Agg backend, colours by value, saving. matplotlib is
imported where a figure is drawn (the drawing children), not where the report is only read and
written (the sweeper, whose import of it took half a second beside MLflow's)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@functools.cache
def pyplot() -> Any:
    """matplotlib's pyplot, set up once."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, the same pixels on every machine
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3, "font.size": 9, "legend.fontsize": 8})
    return plt


# Axes whose values span decades read better on a log scale.
LOG_AXES = ("lr", "reg", "batch_size", "hidden")


def fmt(value: Any) -> str:
    """A value as names and figures show it: floats to 4 significant digits (the run's params keep all)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def palette(values: Sequence[Any]) -> dict[str, Any]:
    """A distinct colour per value (by its text): ordered values along viridis, others tab10/tab20."""
    keys = list(dict.fromkeys(fmt(v) for v in values))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric and len(keys) > 1:
        ordered = sorted(dict.fromkeys(values))
        cmap = pyplot().get_cmap("viridis")
        return {fmt(v): cmap(0.9 * i / (len(ordered) - 1)) for i, v in enumerate(ordered)}
    cmap = pyplot().get_cmap("tab10" if len(keys) <= 10 else "tab20")
    return {k: cmap(i % cmap.N) for i, k in enumerate(keys)}


def grid(rows: int, cols: int, width: float = 4.2, height: float = 3.2) -> tuple[Figure, Any]:
    fig, ax = pyplot().subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained")
    return fig, ax


def use_log(key: str, values: Sequence[Any]) -> bool:
    nums = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return key in LOG_AXES and len(nums) > 1 and max(nums) / min(nums) >= 8


def save(fig: Figure, path: Path) -> Path:
    """The figure as a PNG. Its constrained layout fits titles, labels and outside legends in the
    figure; only a note placed below it (``fig.text``) needs the tight box, which draws it twice."""
    tight = {"bbox_inches": "tight", "pad_inches": 0.15} if fig.texts else {}
    fig.savefig(path, format="png", **tight)
    pyplot().close(fig)
    return path


def log_ticks(ax: Any, values: Sequence[float]) -> None:
    """Label a log axis at the points' own values (e.g. nproc 1, 2, 4), not at decades only."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(values)))
    ax.set_xticklabels([fmt(v) for v in sorted(set(values))])
    ax.minorticks_off()


def finite_max(values: Sequence[float]) -> float:
    ok = [v for v in values if math.isfinite(v)]
    return max(ok) if ok else 1.0


def is_numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def key_legend(fig: Figure, axes: Any, a: Any, key: str | None, values: Sequence[Any]) -> None:
    """Name the colours: a legend for up to 10 values, a colour bar of the values beyond (every line
    stays drawn, and a bar does not hide them)."""
    distinct = sorted(set(values)) if is_numeric(values) else list(dict.fromkeys(values))
    if key is None or len(distinct) <= 10 or not is_numeric(values):
        handles, labels = a.get_legend_handles_labels()
        seen = dict(zip(labels, handles))  # one entry a label
        fig.legend(seen.values(), seen.keys(), title=key, loc="outside right upper", fontsize=8)
        return
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm, ListedColormap

    colours = palette(distinct)
    cmap = ListedColormap([colours[fmt(v)] for v in distinct])
    norm = BoundaryNorm(range(len(distinct) + 1), cmap.N)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, fraction=0.02, pad=0.01)
    step = max(1, len(distinct) // 12)
    bar.set_ticks([i + 0.5 for i in range(0, len(distinct), step)], labels=[fmt(v) for v in distinct[::step]])
    bar.set_label(key)
