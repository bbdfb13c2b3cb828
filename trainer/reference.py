"""The course's correctness check: train the same network sequentially with NumPy and compare.

The reference weights depend on the model (its layout and init), the data (and its pixel scale),
the schedule, the dtype and the seed, never on nproc, the device or the communication, so they are
cached under a hash of exactly those and a sweep over nproc computes them once.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np

from trainer import model
from trainer.loop import Schedule, fit

# Bump when the math or the init changes, so stale cached references are never reused.
VERSION = 1


def cache_key(
    layout: model.Layout, schedule: Schedule, dtype: str, seed: int, data_fingerprint: str, *, init: str, scale: str
) -> str:
    """``init``: model.init (the seed alone does not say the initial weights); ``scale``: data.scale
    (the fingerprint hashes the scaled pixels too, named here so that the key says it)."""
    what = {
        "version": VERSION,
        "layout": asdict(layout),
        "init": init,
        "scale": scale,
        "schedule": asdict(schedule),
        "dtype": dtype,
        "seed": seed,
        "data": data_fingerprint,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def reference_params(
    layout: model.Layout, init: np.ndarray, x: np.ndarray, y: np.ndarray, schedule: Schedule, cache: Path, key: str
) -> tuple[np.ndarray, bool]:
    """Final weights of the sequential NumPy run, and whether they came from the cache."""
    path = Path(cache) / f"{key}.npy"
    if path.is_file():
        return np.load(path), True
    params = fit(np, layout, init.copy(), x, y, schedule)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, params)
    os.replace(tmp, path)  # atomic: concurrent points of a sweep never read half a file
    return params, False


def relative_errors(layout: model.Layout, params: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """||W - W_ref||_F / ||W_ref||_F for W1, b1, W2, b2 and their max."""
    errors = {}
    for name, w, r in zip(model.NAMES, layout.views(params), layout.views(ref)):
        norm = np.linalg.norm(r)
        diff = np.linalg.norm(w.astype(np.float64) - r)
        errors[name] = float(diff / norm) if norm > 0 else float(diff)
    errors["max"] = max(errors.values())
    return errors
