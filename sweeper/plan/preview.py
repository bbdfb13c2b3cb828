"""The dry run's words: a table of the points (what each trains on, how long, with what, and what it
should cost), what the runner would submit, and what could not be checked here."""

from __future__ import annotations

from sweeper import display
from sweeper.plan import cost
from sweeper.points import Point
from sweeper.report.resources import UNITS
from trainer import data
from trainer.errors import ConfigError
from trainer.record.run_record import flat_params


def preview(
    points: list[Point],
    scripts: dict[str, str],
    unchecked: str = "",
    data_unchecked: str = "",
    rates: dict[tuple[str, ...], cost.Rate] | None = None,
    store: str = "",
) -> None:
    """The table, the scripts, and then the cost estimate from ``rates`` (earlier runs in ``store``)
    and what could not be checked (the scheduler does not answer, the data is elsewhere, the machine
    is too small)."""
    rates = rates or {}
    costs = [point_cost(p, rates) for p in points]
    display.preview([preview_row(p, c) for p, c in zip(points, costs)], scripts)
    display.console.print(cost_line(costs, store))
    for p in points:
        if p.cannot:
            said = p.cannot if p.cannot.startswith(f"point {p.name}") else f"{p.name}: {p.cannot}"
            display.console.print(f"[yellow]not on this machine:[/yellow] {said}")
    if data_unchecked:
        display.console.print(f"[yellow]data not checked here:[/yellow] {data_unchecked}")
    if unchecked:
        display.console.print(
            f"[yellow]not checked:[/yellow] {unchecked}. The partition's limits are unknown here: what the "
            "launcher keys leave null is assumed (a point's ranks on one node, one GPU each unless device=cpu; "
            "set launcher.gpus_per_node, ranks_per_node, max_nodes to preview others)."
        )


def samples(p: Point) -> int | None:
    """The samples a point trains on: epochs x its training images (None where its data is not here)."""
    t = p.trainer
    n_train = t.data.n_train
    if n_train is None:
        try:
            n_train = data.train_images(t.data.dir)
        except ConfigError:
            return None
    return int(t.epochs) * int(n_train)


def point_cost(p: Point, rates: dict[tuple[str, ...], cost.Rate]) -> tuple[float, str] | None:
    """(device-seconds, gpu | cpu) from earlier runs of the point's shape; None with none, or no data here."""
    rate = rates.get(cost.cost_key(flat_params(p.trainer)))
    n = samples(p)
    if rate is None or n is None:
        return None
    return rate.seconds(n), rate.kind


def preview_row(p: Point, estimate: tuple[float, str] | None = None) -> dict[str, str]:
    """A point as the preview shows it: what it trains on, how long, with what, at what cost."""
    t = p.trainer
    images = f"{t.data.n_train or 'all'} of {t.data.dir or 'the embedded digits'}"
    resources = p.shape.describe() + (" (not here)" if p.cannot else "")
    return {"#": str(p.index), "point": p.name, "nproc": str(p.nproc), "batch": str(t.batch_size),
            "epochs": str(t.epochs), "training images": images, "resources": resources,
            "estimate": cost.said(*estimate) if estimate else "-"}  # fmt: skip


def cost_line(costs: list[tuple[float, str] | None], store: str) -> str:
    """The sweep's estimate in a line: totals by device kind and the points it does not cover."""
    known = [c for c in costs if c is not None]
    shape = "width, batch, ranks, device, dtype, GEMM mode"
    if not known:
        return (
            f"estimate: none; no finished run in {store or 'the store'} shares a point's shape ({shape}). "
            "A point's device-seconds are recorded when it runs (resources/gpu_s, resources/cpu_s)."
        )
    totals: dict[str, float] = {}
    for seconds, kind in known:
        totals[kind] = totals.get(kind, 0.0) + seconds
    said = " and ".join(f"{s:.4g} {UNITS[k]}-seconds ({s / 3600:.3g} {UNITS[k]}-hours)" for k, s in totals.items())
    line = f"estimate: about {said} for {len(known)} of {len(costs)} points, from earlier runs of their shape ({shape})"
    missing = len(costs) - len(known)
    if missing:
        line += f"; {missing} point(s) have no earlier run of their shape in {store or 'the store'}: not counted"
    return line + "."
