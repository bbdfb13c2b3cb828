"""From Hydra's expanded points to jobs: each point's trainer config and resource shape.

A point's shape comes from the launcher's runner (sweeper/runners/): e.g. on Slurm, nproc MPI
ranks over ceil(nproc / ranks_per_node) nodes. Points of one shape are submitted as one job array.
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from sweeper import display
from sweeper.points import Point, Shape
from sweeper.runners.base import MachineTooSmallError
from trainer.config import TrainerConfig, validate
from trainer.errors import ConfigError
from trainer.override_checks import unknown_key
from trainer.record.identity import config_hash

if TYPE_CHECKING:
    from sweeper.runners.base import Runner

SWEEP_ONLY_KEYS = ("launcher", "sweep", "report", "hydra")


@functools.cache
def _schema() -> bytes:
    # OmegaConf.structured costs ~15 ms and copy.deepcopy ~3: build it once, unpickle a copy (~0.5 ms).
    return pickle.dumps(OmegaConf.structured(TrainerConfig), protocol=pickle.HIGHEST_PROTOCOL)


def _resolved(sweep_cfg: DictConfig, key: str) -> Any:
    """What OmegaConf.to_container(sweep_cfg, resolve=True)[key] holds, resolved against the whole config."""
    if OmegaConf.is_missing(sweep_cfg, key):
        return "???"
    value = sweep_cfg[key]
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


_last: tuple[dict[str, Any], bytes] | None = None  # the last point's values and its typed config, pickled


def trainer_config(sweep_cfg: DictConfig) -> DictConfig:
    """The trainer's part of a composed sweep config, typed as TrainerConfig."""
    global _last
    # Only the trainer's keys: resolving the hydra section too was half of this function's time.
    values = {k: _resolved(sweep_cfg, k) for k in sweep_cfg if k not in SWEEP_ONLY_KEYS}
    # A grid's points differ in a key or two: merge those into a copy of the last point's typed config
    # (merging every value into the schema, OmegaConf's type checks of each, was 24 of a point's 58 ms).
    if _last is not None and _last[0].keys() == values.keys():
        cfg, changed = pickle.loads(_last[1]), {k: v for k, v in values.items() if _last[0][k] != v}
        if any(isinstance(v, dict) for v in changed.values()):  # a merge adds keys, never drops them:
            schema = pickle.loads(_schema())  # a changed group starts again from the schema's
            for k in (k for k, v in changed.items() if isinstance(v, dict)):
                cfg[k] = schema[k]
    else:
        cfg, changed = pickle.loads(_schema()), values
    try:
        cfg.merge_with(changed)  # what OmegaConf.merge does after copying its first argument (not read-only)
    except (ConfigKeyError, ConfigAttributeError) as e:  # +hiden=16: a key no trainer has
        raise ConfigError(unknown_key(str(e.full_key), OmegaConf.structured(TrainerConfig))) from None
    _last = (values, pickle.dumps(cfg, protocol=pickle.HIGHEST_PROTOCOL))
    # Jobs run in other folders and on other nodes: paths must hold from anywhere.
    cfg.check.cache_dir = str(Path(cfg.check.cache_dir).expanduser().resolve())
    if cfg.data.dir is not None:
        cfg.data.dir = str(Path(cfg.data.dir).expanduser().resolve())
    OmegaConf.set_struct(cfg, True)
    return cfg


def plan(points: list[Point], runner: Runner, preview: bool = False) -> dict[Shape, list[Point]]:
    """Validate every point and group them by shape. Raises ConfigError before any submission; a
    ``preview`` shows a point this machine is too small for (its ``cannot``) instead."""
    if not points:
        raise ConfigError("the sweep is empty: no point to run; check the sweep's values (e.g. hidden=512,1024)")
    groups: dict[Shape, list[Point]] = {}
    for p in points:
        validate(p.trainer)
        try:
            p.shape = runner.shape(p)
        except MachineTooSmallError as e:
            if not preview:
                raise
            p.cannot, p.shape = str(e), Shape(1, p.nproc, int(p.trainer.device.value == "gpu"))
        p.config_hash = config_hash(p.trainer)
        groups.setdefault(p.shape, []).append(p)
    return groups


def distinct(points: list[Point], groups: dict) -> tuple[list[Point], dict]:
    """A grid that names one config twice (``hidden=16,16``) runs it once."""
    first: dict[str, Point] = {}
    for p in points:
        if p.config_hash in first:
            same = first[p.config_hash].index
            display.console.print(f"duplicate {p.name}: the same config as point {same}, run once")
        else:
            first[p.config_hash] = p
    kept = {id(p) for p in first.values()}
    groups = {shape: [p for p in members if id(p) in kept] for shape, members in groups.items()}
    return list(first.values()), groups
