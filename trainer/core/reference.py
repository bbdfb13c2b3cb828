"""The course's correctness check: train the same network sequentially with NumPy and compare.

The check compares weights after the same k steps (``check.steps``): the first few by default,
where the two runs differ by rounding alone, or every step of the run (``all``), where training's
chaos amplifies rounding with the learning rate (the course's error-vs-lr study). The reference
weights depend on the model (its layout and init), the data (and its pixel scale), the schedule
but for its epochs, the dtype, the seed and k, never on nproc, the device or the communication,
so they are cached under a hash of exactly those: a sweep over nproc or epochs computes them once.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from trainer.core import model
from trainer.core.generic_step import generic
from trainer.core.loop import Schedule, Snapshot, fit

# Bump when the math or the init changes, so stale cached references are never reused.
VERSION = 2


def steps_of(steps: int | str, n_samples: int, schedule: Schedule) -> int:
    """check.steps ("all", or k) as a number of steps of this run: at most the run's own."""
    total = schedule.epochs * -(-n_samples // schedule.batch_size)
    return total if steps == "all" else min(int(steps), total)


def cache_key(
    layout: model.Layout,
    schedule: Schedule,
    dtype: str,
    seed: int,
    data_fingerprint: str,
    *,
    init: str,
    scale: str,
    steps: int,
) -> str:
    """``init``: model.init (the seed alone does not say the initial weights); ``scale``: data.scale
    (the fingerprint hashes the scaled pixels too, named here so that the key says it); ``steps``:
    the steps compared, which stand for the schedule's epochs."""
    what = {
        "version": VERSION,
        "layout": asdict(layout),
        "init": init,
        "scale": scale,
        "schedule": {k: v for k, v in asdict(schedule).items() if k != "epochs"},
        "steps": steps,
        "dtype": dtype,
        "seed": seed,
        "data": data_fingerprint,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def cached(cache: Path, key: str) -> np.ndarray | None:
    """The reference's weights under ``key`` in ``cache``, or None: a file there is complete (it is
    written aside and renamed into place)."""
    path = Path(cache) / f"{key}.npy"
    return np.load(path) if path.is_file() else None


def reference_params(
    layout: model.Layout,
    init: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    schedule: Schedule,
    steps: int,
    cache: Path,
    key: str,
    on_step: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, bool]:
    """The sequential NumPy run's weights after its first ``steps`` steps, and whether they came from
    the cache (else computed and written there); ``on_step`` is told each step done."""
    if (weights := cached(cache, key)) is not None:
        return weights, True
    snapshot = Snapshot(steps, stop=True)
    epochs = -(-steps // -(-len(y) // schedule.batch_size))
    params = init.copy()
    schedule = replace(schedule, epochs=epochs)
    fit(generic(np, layout, params), np, params, x, y, schedule, snapshot=snapshot, on_step=on_step)
    path = Path(cache) / f"{key}.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, snapshot.weights)
    os.replace(tmp, path)  # atomic: concurrent points of a sweep never read half a file
    return snapshot.weights, False


def relative_errors(layout: model.Layout, params: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """||W - W_ref||_F / ||W_ref||_F for W1, b1, W2, b2 and their max."""
    errors = {}
    for name, w, r in zip(model.NAMES, layout.views(params), layout.views(ref)):
        norm = np.linalg.norm(r)
        diff = np.linalg.norm(w.astype(np.float64) - r)
        errors[name] = float(diff / norm) if norm > 0 else float(diff)
    errors["max"] = max(errors.values())
    return errors
