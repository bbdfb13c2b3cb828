"""What a sweep shows: live counts of points (plain lines off a terminal), previews, the summary."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from trainer import metrics

# Off a terminal (CI logs, files) rich would wrap at 80 columns: give tables room, and leave a
# message's line whole (a long folder would break it, and grep with it).
_TTY = sys.stdout.isatty()
console = Console(highlight=False, width=None if _TTY else 160, soft_wrap=not _TTY)
STATES = ("queued", "running", "done", "failed", "skipped", "cancelled")


class Progress:
    """Counts of points by state with elapsed time; a live line on a terminal, else plain lines."""

    def __init__(self, total: int) -> None:
        self.total, self.t0, self.last = total, time.monotonic(), ""
        self.live = Live(console=console, transient=True) if console.is_terminal else None

    def __enter__(self) -> Progress:
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self.live.stop()

    def update(self, counts: dict[str, int], pending: dict[str, int] | None = None) -> None:
        """``pending``: the scheduler's jobs not started yet, by its reason."""
        text = "  ".join(f"{s} {counts.get(s, 0)}" for s in STATES if counts.get(s)) + f"  of {self.total}"
        if pending:
            text += "  (jobs pending: " + ", ".join(f"{n} {reason}" for reason, n in sorted(pending.items())) + ")"
        if self.live:
            self.live.update(f"[bold]sweep[/bold] {text}  [dim]{time.monotonic() - self.t0:.0f} s[/dim]")
        elif text != self.last:
            console.print(f"[sweep {time.monotonic() - self.t0:6.1f} s] {text}")
        self.last = text


def preview(rows: list[tuple[str, int, str, str]], sbatch: dict[str, str]) -> None:
    """The points and their resources, then what would be submitted, under its titles."""
    table = Table(title="sweep preview: nothing submitted")
    for col in ("#", "point", "nproc", "resources"):
        table.add_column(col)
    for name, nproc, resources, index in rows:
        table.add_row(index, name, str(nproc), resources)
    console.print(table)
    for title, text in sbatch.items():
        console.print(f"[bold]{title}[/bold]\n{text}")


@dataclass
class Outcome:
    name: str
    status: str  # FINISHED, FAILED, KILLED, SKIPPED, CANCELLED
    run: Any = None  # the MLflow run, when there is one
    error: str = ""
    log: str = ""
    job: str = ""  # the scheduler's job and its last word on it: "1234_0 COMPLETED 00:00:12"


def summary(outcomes: list[Outcome]) -> None:
    table = Table(title="sweep summary")
    jobs = any(o.job for o in outcomes)
    for col in ("point", "status", "final loss", "precision", "max weight err", "epoch s", "run id", "job"):
        if col != "job" or jobs:
            table.add_column(col, overflow="fold")
    for o in outcomes:
        m = o.run.data.metrics if o.run is not None else {}

        def fmt(key: str, spec: str, m: dict = m) -> str:
            return format(m[key], spec) if key in m else "-"

        colour = {"FINISHED": "green", "SKIPPED": "cyan"}.get(o.status, "red")
        table.add_row(
            o.name,
            f"[{colour}]{o.status}[/{colour}]",
            fmt(metrics.TRAIN_LOSS_EPOCH, ".4f"),
            fmt(metrics.TEST_PRECISION, ".4f"),
            fmt(metrics.weight_error("max"), ".2e"),
            fmt(metrics.EPOCH_TIME, ".3f"),
            o.run.info.run_id if o.run is not None else "-",
            *([o.job or "-"] if jobs else []),
        )
    console.print(table)
    for o in outcomes:
        if o.error or (o.status not in ("FINISHED", "SKIPPED") and o.log):
            why = "\n  ".join(o.error.strip().splitlines())
            console.print(f"[red]{o.name}[/red] {o.status}: {why}" + (f"\n  log: {o.log}" if o.log else ""))


def mlflow_ui_command(uri: str) -> str:
    """How to open the tracking store in MLflow's UI (a server's URI is already one)."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri}"


def mlflow_run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page. MLflow 3's UI opens on its GenAI views unless told the workflow."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"
