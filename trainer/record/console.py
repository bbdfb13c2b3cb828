"""What rank 0 prints: a line per epoch (thinned for long runs) and a closing table."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def _console() -> Any:
    from rich.console import Console  # imported at the first line printed: not on the way to the first batch

    return Console(stderr=False, highlight=False)


def should_print(epoch: int, epochs: int) -> bool:
    return epochs <= 20 or epoch in (1, epochs) or epoch % max(1, epochs // 10) == 0


def epoch_line(epoch: int, epochs: int, loss: float, precision: float | None, seconds: float) -> None:
    if should_print(epoch, epochs):
        prec = "" if precision is None else f"  test precision {precision:.4f}"
        _console().print(f"epoch {epoch:>{len(str(epochs))}}/{epochs}  loss {loss:.5f}{prec}  {seconds:.3f} s")


def resumed(run_id: str, epoch: int, epochs: int) -> None:
    _console().print(f"resuming run {run_id} from its checkpoint after epoch {epoch}/{epochs}")


def summary(run_id: str, uri: str, rows: dict[str, str]) -> None:
    from rich.table import Table

    table = Table(title=f"run {run_id}", show_header=False)
    for key, value in rows.items():
        table.add_row(key, value)
    _console().print(table)
    _console().print(f"see it with: {mlflow_ui_command(uri)}")


UI_PORTS = range(5000, 5100)  # MLflow's own default first


@cache
def ui_port() -> int:
    """A port on 127.0.0.1 where nothing listens now, for the printed ``mlflow ui`` and its links:
    MLflow's 5000 unless another server (another project's MLflow, a tracking server) has it."""
    import socket

    for port in UI_PORTS:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:  # refused: nothing listens there
                return port
    return UI_PORTS[0]


def mlflow_ui_command(uri: str) -> str:
    """How to open the store in MLflow's UI, whether or not this environment's bin is on PATH, on a
    port free now (a server's URI is one already). One worker: a researcher's own UI serves one
    browser, and MLflow's default four took 15 s and 24 CPU-s to answer against one's 9 s and 8."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    import shlex
    import sys

    store = shlex.quote(uri)
    return f"{shlex.quote(sys.executable)} -m mlflow ui --backend-store-uri {store} --port {ui_port()} --workers 1"


def check_line(steps: int, error: float) -> None:
    _console().print(f"max weight error vs CPU after {steps} steps: {error:.3e}")
