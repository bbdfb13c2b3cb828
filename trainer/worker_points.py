"""What a warm worker knows of its points (trainer/worker.py): their configs, read from the JSON
the sweeper wrote and checked by the typed schema; their data sets, loaded once; their CPU
references, started ahead of their training on a GPU worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.lifecycle import queue_files


def load_point(point_dir: Path) -> Any:
    """The point's config as the sweeper planned it: its resolved values (data, never a pickle: a
    file in a shared folder must not run code) merged into the typed schema, which checks every key
    and type again (a few milliseconds; composing the YAML with Hydra takes tens)."""
    return load_values(point_dir / queue_files.POINT_DATA)


def load_values(path: Path) -> Any:
    """A trainer config from its resolved values in a JSON file, typed and checked (load_point)."""
    from omegaconf import OmegaConf

    from trainer.config import schema

    with open(path) as f:
        values = json.load(f)
    cfg = OmegaConf.merge(schema(), values)  # merge copies its first: the schema stays as built
    OmegaConf.set_struct(cfg, True)  # as Hydra composes it: a key set later that does not exist is refused
    return cfg


class Datasets:
    """Data sets loaded once per worker: points that differ in the model share one."""

    def __init__(self) -> None:
        self.loaded: dict[tuple, Any] = {}

    def get(self, cfg: Any) -> Any:
        from trainer.run import load_data

        if (key := queue_files.data_key(cfg)) not in self.loaded:
            self.loaded[key] = load_data(cfg)
        return self.loaded[key]

    def preload(self, hint: str | None) -> None:
        """Load the data set the sweeper's hint names (a point that needs it says what is wrong with it)."""
        from trainer import data

        try:
            key = tuple(json.loads(hint)) if hint else None
            if key is not None and key not in self.loaded:
                self.loaded[key] = data.load(*key)
        except Exception:  # a hint only: the point that needs the data set loads it again and says why
            pass


def prefetch_checks(configs: list[Path], datasets: Datasets) -> list[Any]:
    """On a GPU, the CPU references of these points' configs (JSON values) start now, on the cores
    the GPU leaves idle: the last point's check no longer trails its training (trainer/lifecycle/check.py).
    Asked before the worker's CUDA warm-up, so the GPUs are counted without CuPy. The jobs started."""
    from trainer.lifecycle.check import prefetch
    from trainer.ranks.backend import visible_gpus
    from trainer.run import schedule_of

    if visible_gpus() == 0:  # a CPU worker's references run after their points' timed batches, on its cores
        return []
    jobs = []
    for path in configs:
        try:
            cfg = load_values(path)
            ds = datasets.loaded.get(queue_files.data_key(cfg))
            if ds is not None and cfg.device.value != "cpu" and (job := prefetch(cfg, ds, schedule_of(cfg))):
                jobs.append(job)
        except Exception:  # claimed meanwhile, or a point that will say itself what is wrong with it
            continue
    return jobs
