"""Build a study's report and publish it: the folder, the parent run's artifacts, its description.

study (MLflow) -> analysis -> figures, CSV, HTML, Markdown summary -> the sweep folder and the
parent run (artifacts under ``report/``, the summary as ``mlflow.note.content``, summary metrics).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeper.report import (
    analysis,
    convergence,
    families,
    findings,
    page,
    resources,
    scaling,
    search_progress,
    time_to_target,
)
from sweeper.report.drawing import draw
from sweeper.report.overhead import Overhead, per_sweep
from sweeper.report.points_csv import csv_rows, write_csv
from sweeper.report.roofline import roofline_figure
from sweeper.report.study import Point, Study
from trainer import metrics

ARTIFACT_DIR = "report"
CHECKS_CAPTION = "Weight error against the CPU reference"


@dataclass
class Report:
    folder: Path
    figures: dict[str, Path] = field(default_factory=dict)  # caption -> PNG
    rows: list[dict[str, Any]] = field(default_factory=list)  # the CSV's rows
    summary: str = ""  # Markdown
    findings: list[str] = field(default_factory=list)  # the study's take-aways, in words
    brief: list[str] = field(default_factory=list)  # the same for a terminal: a line or two each
    left_out: dict[str, str] = field(default_factory=dict)  # caption -> why that figure has nothing to show
    best: Point | None = None
    overhead: list[Overhead] = field(default_factory=list)  # one per sweep
    seconds: float = 0.0


def sweep_order(study: Study) -> list[str]:
    """The axes in the order the sweep's command gave them."""
    keys = []
    for s in study.sweeps:
        keys += [o.split("=", 1)[0].lstrip("+~") for o in s.overrides.split() if "=" in o]
    return keys


def build(study: Study, folder: Path, target: float | None = None, checks: bool = True) -> Report:
    """``target``: the test precision of the time-to-accuracy figure (report.target; None: a default).
    ``checks``: False while CPU checks still compute: their figure is left for :func:`draw_checks`."""
    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    report = Report(folder)
    order = sweep_order(study)
    every_axis, points, finished, axis = _arranged(study, order)
    # What every figure but the weight error's reads: a figure drawn while the checks landed is kept.
    drawable = [p.without_check() for p in finished]
    configs = [p.config for p in finished]
    drawn: dict[str, Any] = {}  # caption -> the figure's future (drawing.py draws them side by side)
    if finished:
        drawn["Training loss of every point"] = draw(
            convergence.loss_curves, drawable, axis, folder / "convergence.png"
        )
        drawn["Precision and loss by epoch"] = draw(
            convergence.precision_by_epoch, drawable, axis, folder / "precision.png"
        )
        drawn["Final values and the best point"] = draw(convergence.finals, drawable, axis, folder / "finals.png")
        if checks:
            drawn[CHECKS_CAPTION] = _weight_error(finished, axis, folder)
        else:
            report.left_out[CHECKS_CAPTION] = "the CPU checks are still computing"
    fams = [(f, families.family_rows(drawable, f)) for f in families.families(configs, order)]
    for kind in ("strong", "weak"):
        mine = [(f, rows) for f, rows in fams if f.kind == kind]
        if mine:
            drawn[f"{kind.capitalize()} scaling"] = draw(
                scaling.scaling_figure, kind, mine, folder / f"scaling_{kind}.png"
            )
    if fams:
        drawn["Phases per nproc"] = draw(scaling.phases_figure, fams, folder / "phases.png")
    studies = families.batch_studies(configs, order)
    regimes = scaling.batch_regimes(drawable, studies)  # the summary's, with or without the figure
    if studies:
        drawn["Batch size: regimes of data parallelism"] = draw(
            scaling.regimes_figure, drawable, studies, folder / "regimes.png"
        )
    target = time_to_target.default_target(drawable) if target is None else target
    reaching = time_to_target.rows(drawable, target, order) if target is not None else []
    if reaching:  # a sweep over nproc: how long each took to the target, against its ranks
        write_csv(time_to_target.csv_rows(reaching, target), folder / "time_to_target.csv")
        drawn["Time to accuracy against GPUs"] = draw(
            time_to_target.figure, reaching, target, folder / "time_to_target.png"
        )
    for sweep in study.sweeps:  # a search's: its objective by trial, the best so far, against each value
        if sweep.search:
            s = sweep.search
            drawn["Search: objective by trial"] = draw(search_progress.figure, points, s, folder / "search.png")
            break
    drawn["Roofline"] = draw(roofline_figure, drawable, folder / "roofline.png")
    for caption, future in drawn.items():
        made = future.result()
        if isinstance(made, tuple):  # the regimes' and the roofline's: the figure and what it found
            made = made[0]
        if isinstance(made, str):  # nothing worth a figure: the reason, in a line
            report.left_out[caption] = made
        elif made:
            report.figures[caption] = made
    report.rows = csv_rows(points, every_axis, fams, finished)
    write_csv(report.rows, folder / "points.csv")
    # A study built by hand has no runs list: its points are then the runs it ran.
    report.overhead = per_sweep(study.sweeps, study.runs or study.points)
    write_csv([o.row() for o in report.overhead], folder / "overhead.csv")
    report.best = analysis.best_point(finished, lambda p: p.metrics.get(metrics.TEST_PRECISION))
    if findings.timing_study(finished):
        report.best = None  # a timing study's precision is not its result
    report.findings = findings.findings(points, axis, report.best, fams)
    report.brief = findings.brief(points, axis, report.best, fams)
    table = scaling.family_table(fams)
    report.summary = summary_markdown(study, points, report, fams, regimes)
    (folder / "summary.md").write_text(report.summary)
    page.write(folder / "report.html", study, report, every_axis, table, regimes)
    report.seconds = time.perf_counter() - t0
    return report


def draw_checks(study: Study, folder: Path) -> Any:
    """The weight error's figure alone, as :func:`build` draws it (its future; None without a
    finished point): drawn as soon as the last checks land, while the other figures still draw."""
    _every, _points, finished, axis = _arranged(study, sweep_order(study))
    return _weight_error(finished, axis, folder) if finished else None


def _weight_error(finished: list[Point], axis: list[str], folder: Path) -> Any:
    return draw(convergence.weight_error, [p.only_check() for p in finished], axis, folder / "weight_error.png")


def _arranged(study: Study, order: list[str]) -> tuple[list[str], list[Point], list[Point], list[str]]:
    """Every axis, the points sorted along them, the finished ones, and the axes that vary among those."""
    every_axis = analysis.axes([p.config for p in study.points], order)
    points = sorted(study.points, key=lambda p: [_sort_key(p.get(k)) for k in every_axis])
    finished = [p for p in points if p.status == "FINISHED"]
    return every_axis, points, finished, analysis.axes([p.config for p in finished], order)


def _sort_key(value: Any) -> tuple:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, value, "") if numeric else (1, 0, str(value))


def _num(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def summary_markdown(study: Study, points: list[Point], report: Report, fams: list, regimes: dict[str, list]) -> str:
    """The parent run's description in the MLflow UI: what ran, the findings, the tables."""
    s, best = study.sweeps[0], report.best
    done = sum(p.status == "FINISHED" for p in points)
    lines = [
        f"**{s.name or 'sweep'}**: {len(points)} point(s), {done} finished"
        + (f", {len(study.missing)} without a run" if study.missing else ""),
        "",
    ]
    if s.command:
        lines += [f"`{s.command}`", ""]
    lines += [*(f"- {sentence}" for sentence in report.findings), ""]
    if best is not None:
        lines += [f"Best point: `{best.name}` (run `{best.run_id}`).", ""]
    lines += ["| point | status | final loss | precision | ms/batch | max weight err |", "|---|---|---|---|---|---|"]
    for p in points:
        m, bad = p.metrics, p.diverged
        status = p.status + (" (reused)" if p.reused else "") + (f", diverged at step {bad.step}" if bad else "")
        lines.append(
            f"| {p.name} | {status} | {_num(p.loss_epoch[-1][1] if p.loss_epoch else None, '.4f')} "
            f"| {_num(m.get(metrics.TEST_PRECISION), '.4f')} | {_num(m.get(metrics.phase_time('batch')), '.3f')} "
            f"| {_num(m.get(metrics.weight_error('max')), '.2e')} |"
        )
    for name, why in study.missing:
        lines.append(f"| {name} | {why} | - | - | - | - |")
    for fam, rows in fams:
        text = ", ".join(
            f"{r.nproc}: {r.speedup:.2f}x ({r.efficiency:.0%}{'' if r.trusted else ', timed with ' + r.company})"
            for r in rows
        )
        lines += ["", f"{fam.kind.capitalize()} scaling, {fam.label}: speedup (efficiency) by nproc {text}"]
    for label, segs in regimes.items():
        text = "; ".join(f"B {g.lo}->{g.hi}: {g.name} (slope {g.slope:.2f})" for g in segs)
        lines += ["", f"Batch-size regimes, {label}: {text}"]
    for h in resources.held((p.nproc, p.metrics) for p in points if not p.reused):
        lines += ["", f"Held: {h.said()}."]
    lines += overhead_markdown(report.overhead)
    lines += ["", f"Figures, CSV and the HTML report: artifacts `{ARTIFACT_DIR}/` of this run."]
    return "\n".join(lines)


def overhead_markdown(overhead: Sequence[Overhead]) -> list[str]:
    """The summary's overhead table, one row per sweep (seconds)."""
    if not overhead:
        return []
    lines = [
        "",
        "Overhead (s): wall = parent run start to end; per point = (wall - training) / points",
        "",
        "| sweep | wall | points | in runs | training | per point | first batch (median) | warm / cold | workers |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for o in overhead:
        lines.append(
            f"| {o.sweep_id} | {o.wall_s:.1f} | {o.points} | {o.in_run_s:.1f} | {o.training_s:.2f} "
            f"| {_num(o.per_point_s, '.2f')} | {_num(o.first_batch_s, '.2f')} | {o.warm} / {o.cold} | {o.workers} |"
        )
    return lines


def publish(client: Any, parent_id: str, report: Report, points: list[Point]) -> None:
    """Attach the report to the parent run: artifacts, description, summary metrics."""
    from mlflow.entities import Metric, RunTag

    client.log_artifacts(parent_id, str(report.folder), ARTIFACT_DIR)
    tags = [RunTag("mlflow.note.content", report.summary[:40000])]
    values: dict[str, float] = {
        "study/points": len(points),
        "study/finished": sum(p.status == "FINISHED" for p in points),
        "study/failed": sum(p.status in ("FAILED", "KILLED") for p in points),
        "study/report_s": report.seconds,
    }
    if len(report.overhead) == 1:  # this parent's own sweep
        o = report.overhead[0]
        values.update({"study/wall_s": o.wall_s, "study/training_s": o.training_s, "study/in_run_s": o.in_run_s})
        if o.per_point_s is not None:
            values["study/overhead_per_point_s"] = o.per_point_s
    if report.best is not None:
        values["study/best_precision"] = report.best.metrics[metrics.TEST_PRECISION]
        tags += [RunTag("study.best_point", report.best.name), RunTag("study.best_run_id", report.best.run_id)]
    now = int(time.time() * 1000)
    client.log_batch(parent_id, metrics=[Metric(k, float(v), now, 0) for k, v in values.items()], tags=tags)
