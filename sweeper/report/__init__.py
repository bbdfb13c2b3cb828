"""The study report: every sweep ends with the comparison it was run for.

study.py reads a sweep from MLflow, analysis.py finds axes, scaling families, divergence and
regimes, overhead.py what the sweep cost around its training, convergence.py / scaling.py /
roofline.py draw, page.py writes the HTML, publish.py puts it all in the sweep folder and on the
parent run. ``python -m sweeper.report`` rebuilds it; ``resources`` totals what a sweep held.

Imports the sweeper's leaves (``points``) and the trainer's contracts and record wing, nothing of
the other wings: ``track``, ``sync`` and the doors import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def report_for(
    client: Any, parents: list[Any], folder: Path, attach: bool = True, target: float | None = None, checks: bool = True
) -> Any:
    """Build the report of these parent runs into ``folder``; attach it to the parent if one.
    ``target``: the time-to-accuracy figure's test precision (None: one most points reach).
    ``checks``: False while CPU checks still compute (their figure is then left out)."""
    from sweeper.report import publish, study

    s = study.load(client, parents)
    report = publish.build(s, folder, target, checks)
    if attach and len(parents) == 1:
        publish.publish(client, parents[0].info.run_id, report, s.points)
    return report
