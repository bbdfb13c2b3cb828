"""What a dry run says a sweep will cost before anything runs: device-seconds per point (GPU-seconds,
or core-seconds where ranks run on CPU cores), from what earlier runs of the same shape held in the
same store.

Each run records the device-seconds it held and the part its epochs took (trainer/metrics.py
``device_seconds``). The training part grows with the samples a point sees (epochs x training
images); the rest (start, check, record) is a point's own. A point is estimated from finished runs
that share what sets a step's cost: width, batch, ranks, device, dtype and GEMM mode. A point with no
such run has no estimate, and the preview says so: a model of the step would guess where the store
has measured (the step is bound by its launches on a GPU, docs/benchmarks.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sweeper.report.resources import UNITS
from trainer import metrics

COST_KEYS = ("hidden", "batch_size", "nproc", "device", "dtype", "gpu.gemm")
MAX_RUNS = 5000  # the newest finished runs of the experiment read for rates


@dataclass(frozen=True)
class Rate:
    kind: str  # gpu | cpu: what the seconds are of
    per_sample_s: float  # device-seconds of training per sample seen
    own_s: float  # device-seconds a point held beside its training
    runs: int

    def seconds(self, samples: int) -> float:
        return self.own_s + self.per_sample_s * samples


@dataclass(frozen=True)
class Measured:
    """One earlier run, as far as its cost goes."""

    key: tuple[str, ...]
    kind: str
    samples: int
    held_s: float
    training_s: float


def cost_key(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The values that set a step's cost, as MLflow keeps a run's params (strings)."""
    return tuple(str(params.get(k)) for k in COST_KEYS)


def rates(runs: Iterable[Measured]) -> dict[tuple[str, ...], Rate]:
    """The median rate of each shape's runs (medians: one run slowed by company moves none)."""
    by_key: dict[tuple[str, ...], list[Measured]] = {}
    for r in runs:
        if r.samples > 0:
            by_key.setdefault(r.key, []).append(r)
    return {
        key: Rate(
            rs[0].kind,
            statistics.median(r.training_s / r.samples for r in rs),
            statistics.median(max(0.0, r.held_s - r.training_s) for r in rs),
            len(rs),
        )
        for key, rs in by_key.items()
    }


def from_run(params: Mapping[str, str], values: Mapping[str, float]) -> Measured | None:
    """A finished run's cost record; None for a run that recorded no device-seconds."""
    for kind in UNITS:
        held = values.get(metrics.device_seconds(kind))
        if held is None:
            continue
        samples = int(values.get(metrics.N_TRAIN, 0)) * int(params.get("epochs", 0) or 0)
        training = values.get(metrics.device_seconds(kind, training=True), 0.0)
        return Measured(cost_key(params), kind, samples, held, training)
    return None


def measured(uri: str, experiment: str) -> list[Measured]:
    """The experiment's finished runs in the store at ``uri``, newest first; none where the store or
    the experiment does not exist yet (a preview creates neither)."""
    from trainer.record import store

    db = store.sqlite_file(uri)
    if db is not None and not db.exists():
        return []
    client = store.client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    runs = client.search_runs(
        [found.experiment_id],
        filter_string="attributes.status = 'FINISHED'",
        max_results=MAX_RUNS,
        order_by=["attributes.start_time DESC"],
    )
    out = (from_run(r.data.params, r.data.metrics) for r in runs)
    return [m for m in out if m is not None]


def said(seconds: float, kind: str) -> str:
    return f"{seconds:.3g} {UNITS[kind]}-s"
