"""What a sweep's points held: GPU-seconds (core-seconds where ranks ran on CPU cores), in all and
per nproc, summed from each run's own record (trainer/metrics.py ``device_seconds``). The closing
lines, the parent run's metrics and the report's summary all read them here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from trainer import metrics

UNITS = {"gpu": "GPU", "cpu": "core"}


@dataclass
class Held:
    kind: str  # gpu or cpu
    total_s: float = 0.0  # ranks x seconds the runs held their devices
    training_s: float = 0.0  # the part their epochs took
    by_nproc: dict[int, float] = field(default_factory=dict)

    def said(self) -> str:
        unit = UNITS[self.kind]
        per = ", ".join(f"nproc={n} {s:.1f}" for n, s in sorted(self.by_nproc.items()))
        return (
            f"{self.total_s:.1f} {unit}-seconds ({self.total_s / 3600:.4f} {unit}-hours), "
            f"{self.training_s:.1f} of them training; by nproc: {per}"
        )


def held(points: Iterable[tuple[int, dict[str, float]]]) -> list[Held]:
    """Totals by device kind over (nproc, the run's metrics) pairs; a run that recorded none (it
    failed before its end) adds nothing."""
    out: dict[str, Held] = {}
    for nproc, m in points:
        for kind in UNITS:
            if (seconds := m.get(metrics.device_seconds(kind))) is None:
                continue
            h = out.setdefault(kind, Held(kind))
            h.total_s += seconds
            h.training_s += m.get(metrics.device_seconds(kind, training=True), 0.0)
            h.by_nproc[nproc] = h.by_nproc.get(nproc, 0.0) + seconds
    return [out[k] for k in UNITS if k in out]


def parent_metrics(totals: list[Held]) -> dict[str, float]:
    """The parent run's metrics: the sweep's totals under the runs' own names, and per nproc."""
    out = {}
    for h in totals:
        out[metrics.device_seconds(h.kind)] = h.total_s
        out[metrics.device_seconds(h.kind, training=True)] = h.training_s
        out |= {f"{metrics.device_seconds(h.kind)}_nproc{n}": s for n, s in h.by_nproc.items()}
    return out
