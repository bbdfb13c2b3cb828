"""What a sweep shows: live counts of points (plain lines off a terminal), previews, the summary."""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from trainer import metrics
from trainer.record.console import mlflow_ui_command, ui_port

# Off a terminal (CI logs, files) rich would wrap at 80 columns: give tables room, and leave a
# message's line whole (a long folder would break it, and grep with it). COLUMNS, where set, wins.
_TTY = sys.stdout.isatty()
console = Console(highlight=False, width=None if _TTY or "COLUMNS" in os.environ else 160, soft_wrap=not _TTY)
WIDE = 120  # below this many columns the closing table drops its run ids and its vertical rules
STATES = ("queued", "running", "done", "failed", "skipped", "cancelled")
NAMED = 3  # running points the progress line names
EPOCH = re.compile(r" \(epoch \d+/\d+\)")  # a named point's epoch (sweeper/track/watch.py with_epoch)


class Progress:
    """Counts of points by state with elapsed time; a live line on a terminal, else plain lines."""

    def __init__(self, total: int, label: str = "sweep", t0: float | None = None) -> None:
        """``t0``: when the points began (time.monotonic), for the elapsed time and the time left; now if None."""
        self.total, self.label, self.last = total, label, ""
        self.t0 = time.monotonic() if t0 is None else t0
        self.live = Live(console=console, transient=True) if console.is_terminal else None

    def __enter__(self) -> Progress:
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self.live.stop()

    def update(
        self, counts: dict[str, int], pending: dict[str, int] | None = None, running: list[str] = (), n_running: int = 0
    ) -> None:
        """``pending``: the scheduler's jobs not started yet, by its reason; ``running``: the names of
        the points running now (the first NAMED are named), of ``n_running`` (0: as many as named)."""
        text = "  ".join(f"{s} {counts.get(s, 0)}" for s in STATES if counts.get(s)) + f"  of {self.total}"
        if pending:
            text += "  (jobs pending: " + ", ".join(f"{n} {reason}" for reason, n in sorted(pending.items())) + ")"
        if running:
            n_running = max(n_running, len(running))
            more = f" +{n_running - NAMED}" if n_running > NAMED else ""
            text += "  now: " + ", ".join(running[:NAMED]) + more
        elapsed = time.monotonic() - self.t0
        eta = self.eta(counts, elapsed)
        if self.live:
            self.live.update(f"[bold]{self.label}[/bold] {escape(text)}  [dim]{elapsed:.0f} s{eta}[/dim]")
        elif (key := EPOCH.sub("", text)) != self.last:  # a line when the counts or the points change, not each epoch
            console.print(escape(f"[{self.label} {elapsed:6.1f} s{eta}] {text}"))  # brackets, not markup
            self.last = key

    def eta(self, counts: dict[str, int], elapsed: float) -> str:
        """The time left at the pace so far (points ended a second), once one has ended."""
        ended = counts.get("done", 0) + counts.get("failed", 0)
        left = self.total - ended - counts.get("skipped", 0)
        if not ended or left <= 0:
            return ""
        return f", about {left * elapsed / ended:.0f} s left"


def preview(rows: list[dict[str, str]], sbatch: dict[str, str]) -> None:
    """The points (a row each, by column), then what would be submitted, under its titles."""
    table = Table(title="sweep preview: nothing submitted")
    for col in rows[0] if rows else ():
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*row.values())
    console.print(table)
    for title, text in sbatch.items():
        console.print(f"[bold]{title}[/bold]\n{text}")


ENDED_WELL = ("FINISHED", "SKIPPED", "PRUNED")  # outcomes that fail no sweep (PRUNED: a search stopped it)


@dataclass
class Outcome:
    name: str
    status: str  # FINISHED, FAILED, KILLED, SKIPPED, CANCELLED, PRUNED (a search stopped it between epochs)
    run: Any = None  # the MLflow run, when there is one
    error: str = ""
    log: str = ""
    job: str = ""  # the scheduler's job and its last word on it: "1234_0 COMPLETED 00:00:12"


def summary(outcomes: list[Outcome], report: Any = None) -> None:
    """The closing table; with the sweep's report, each point's samples/s and speedup in its scaling
    family, a diverged marker and the study's best point highlighted."""
    rows = {r["point"]: r for r in report.rows} if report is not None else {}
    best = report.best.name if report is not None and report.best is not None else None
    narrow = console.width < WIDE  # a row a line at 80 columns: the run ids are the MLflow link's
    title = "sweep summary" + (" (best in bold)" if best else "")
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD,
        show_edge=not narrow,
        pad_edge=not narrow,
        collapse_padding=narrow,
    )
    jobs, contended = any(o.job for o in outcomes), False
    restarts = {o.name: _restarts(o) for o in outcomes}
    requeued = any(restarts.values())  # Slurm requeued a point's job (a time limit, preemption, a lost node)
    loss, error = ("loss", "weight err") if narrow else ("final loss", "max weight err")
    columns = ["point", "status", loss, "precision", error, "samples/s", "speedup"]
    columns += ([] if narrow else ["run id"]) + (["restarts"] if requeued else []) + (["job"] if jobs else [])
    longest = max((len(o.name) for o in outcomes), default=5)
    for col in columns:  # numbers whole (an exponent split over two lines reads wrong); names fold
        wraps = col in ("point", "status", "job")
        table.add_column(
            col, overflow="fold", no_wrap=not wraps, min_width=min(longest, 24) if col == "point" else None
        )
    for o in outcomes:
        m = o.run.data.metrics if o.run is not None else {}
        row = rows.get(o.name, {})

        def fmt(key: str, spec: str, m: dict = m) -> str:
            return format(m[key], spec) if key in m else "-"

        colour = {"FINISHED": "green", "SKIPPED": "cyan", "PRUNED": "yellow"}.get(o.status, "red")
        status = f"[{colour}]{o.status}[/{colour}]" + (" [red]diverged[/red]" if row.get("diverged") else "")
        speedup = row.get("strong_speedup") or row.get("weak_speedup") or ""
        beside = bool(speedup) and row.get("timed_alone") == "no"
        contended |= beside
        speedup = f"{float(speedup):.2f}x" + (" [red]![/red]" if beside else "") if speedup else "-"
        cells = [
            o.name,
            status,
            fmt(metrics.TRAIN_LOSS_EPOCH, ".4f"),
            fmt(metrics.TEST_PRECISION, ".4f"),
            fmt(metrics.weight_error("max"), ".2e"),
            _rate(m.get(metrics.SAMPLES_PER_S), narrow),
            speedup,
            *([] if narrow else [o.run.info.run_id if o.run is not None else "-"]),
            *([str(restarts[o.name])] if requeued else []),
            *([o.job or "-"] if jobs else []),
        ]
        table.add_row(*cells, style="bold" if o.name == best else None)
    console.print(table)
    if contended:
        console.print("[red]![/red] not timed alone (other runs, or processes on its cores): see the report's findings")
    for o in outcomes:
        if o.status == "PRUNED":  # the search stopped it: why, no log to read
            console.print(f"[yellow]{o.name}[/yellow] PRUNED: {o.error}")
        elif o.error or (o.status not in ("FINISHED", "SKIPPED") and o.log):
            why = "\n  ".join(o.error.strip().splitlines())
            console.print(f"[red]{o.name}[/red] {o.status}: {why}" + (f"\n  log: {o.log}" if o.log else ""))


def _rate(samples_per_s: float | None, narrow: bool) -> str:
    """Samples/s in full, or at 80 columns in thousands or millions."""
    if samples_per_s is None:
        return "-"
    if narrow and samples_per_s >= 1e4:
        big = samples_per_s >= 1e6
        return f"{samples_per_s / (1e6 if big else 1e3):.1f} {'M' if big else 'k'}"
    return f"{samples_per_s:,.0f}"


def _restarts(o: Outcome) -> int:
    """How often Slurm restarted the job of the point's run (the trainer's tag at its last resume)."""
    found = o.run.data.tags.get(metrics.TAG_RESTARTS, "0") if o.run is not None else "0"
    return int(found) if found.isdigit() else 0


def closing(report: Any, uri: str, experiment_id: str, parent_id: str) -> None:
    """The findings, the report as a link a terminal opens, and the way into MLflow's UI."""
    if report is not None:
        for sentence in report.brief:  # each whole, with its figures, in the report
            console.print(f"- {sentence}")
        page = (report.folder / "report.html").resolve()
        console.print(f"report ({report.seconds:.1f} s): {page}  [link={page.as_uri()}]{page.as_uri()}[/link]")
    console.print(f"MLflow: {mlflow_ui_command(uri)}, then open the experiment's runs")
    console.print(f"  {mlflow_url(uri, experiment_id)}")
    console.print(f"  this sweep: {mlflow_url(uri, experiment_id, parent_id)}")


def mlflow_url(uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """The experiment's runs table, or a run's page. MLflow 3's UI opens an experiment on its GenAI
    views (whatever its kind tag says) unless the link names the workflow."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else f"http://127.0.0.1:{ui_port()}"
    page = f"runs/{run_id}" if run_id else "runs"
    return f"{base}/#/experiments/{experiment_id}/{page}?workflowType=machine_learning"
