"""The report as one self-contained HTML page: figures embedded, tables, provenance."""

from __future__ import annotations

import base64
import platform
from pathlib import Path
from typing import Any

import jinja2

from sweeper.report.plotting import fmt

TEMPLATE = "page.html.j2"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return fmt(value) if value is not None else ""


def write(path: Path, study: Any, report: Any, axis: list[str], scaling_rows: list[dict], regimes: dict) -> Path:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True, undefined=jinja2.StrictUndefined
    )
    figures = [(caption, base64.b64encode(png.read_bytes()).decode("ascii")) for caption, png in report.figures.items()]
    columns = ["point", *axis, "status", "diverged", "final_loss", "final_precision", "weight_error_max", "batch_ms"]
    csv_b64 = base64.b64encode((report.folder / "points.csv").read_bytes()).decode("ascii")
    html = env.get_template(TEMPLATE).render(
        study=study,
        sweep=study.sweeps[0],
        best=report.best,
        findings=report.findings,
        left_out=report.left_out,
        figures=figures,
        columns=columns,
        rows=[[_cell(r.get(c)) for c in columns] for r in report.rows],
        scaling_columns=list(scaling_rows[0]) if scaling_rows else [],
        scaling_rows=[list(r.values()) for r in scaling_rows],
        regimes=regimes,
        missing=study.missing,
        machine=machine(study),
        csv_b64=csv_b64,
        overhead=[o.row() for o in report.overhead],
    )
    path.write_text(html)
    return path


def machine(study: Any) -> str:
    """Where the points ran: hosts and devices from the runs' tags."""
    hosts = sorted({h for p in study.points for h in p.tags.get("sweepscale.hosts", "").split(",") if h})
    devices = sorted({p.tags.get("sweepscale.device_name", "") for p in study.points} - {""})
    text = ", ".join(hosts) or (study.sweeps[0].host if study.sweeps else platform.node())
    return f"{text}: {', '.join(devices)}" if devices else text
