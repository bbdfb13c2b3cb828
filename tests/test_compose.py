"""The launcher's fast composition gives, point by point, exactly the configs Hydra composes (issue #19)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.sweepscale_launcher.compose import PointComposer
from sweeper.config import register
from sweeper.plan.shapes import SWEEP_ONLY_KEYS, trainer_config
from tests.conftest import ROOT
from trainer.config import TrainerConfig


@pytest.fixture(scope="module")
def loader() -> Iterator[Any]:
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        yield GlobalHydra.instance().config_loader()


def grid(loader: Any, args: list[str]) -> tuple[DictConfig, list[list[str]]]:
    """The master config and each point's overrides, as Hydra's multirun and BasicSweeper make them."""
    master = loader.load_configuration("sweep", args, run_mode=RunMode.MULTIRUN)
    params = [f"{k}={v}" for k, v in (OmegaConf.select(master, "hydra.sweeper.params") or {}).items()]
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(params + args)
    (points,) = BasicSweeper.split_arguments(parsed, None)
    return master, [list(p) for p in points]


def numbered(cfg: DictConfig, num: int) -> DictConfig:
    with open_dict(cfg):  # as the launcher does
        cfg.hydra.job.num = num
    return cfg


def old_trainer_config(sweep_cfg: DictConfig) -> DictConfig:
    """sweeper/plan/shapes.py's trainer_config before issue #19: the reference the faster one must match."""
    values = {k: v for k, v in OmegaConf.to_container(sweep_cfg, resolve=True).items() if k not in SWEEP_ONLY_KEYS}
    cfg = OmegaConf.merge(OmegaConf.structured(TrainerConfig), values)
    cfg.check.cache_dir = str(Path(cfg.check.cache_dir).expanduser().resolve())
    if cfg.data.dir is not None:
        cfg.data.dir = str(Path(cfg.data.dir).expanduser().resolve())
    OmegaConf.set_struct(cfg, True)
    return cfg


def assert_same_trainer(fast: DictConfig, slow: DictConfig) -> None:
    assert OmegaConf.to_container(fast, resolve=True) == OmegaConf.to_container(slow, resolve=True)
    assert OmegaConf.to_yaml(fast) == OmegaConf.to_yaml(slow)  # enums and node types too
    assert OmegaConf.get_type(fast) is OmegaConf.get_type(slow) is TrainerConfig
    assert OmegaConf.is_struct(fast) and OmegaConf.is_struct(slow)


SWEEPS = [
    (["hidden=8,16", "lr=0.1,0.2", "nproc=1,2"], 7),  # plain values: all but the first point fast
    (["gpu=default,tf32", "hidden=8,16"], 2),  # a group: Hydra composes each of its options once
    (["launcher=local,debug", "nproc=1", "hidden=8,16,32"], 4),
    (["+experiment=scaling"], 8),  # the preset's own grid; batch_size=${mul:3200,${nproc}} follows nproc
    (["+experiment=lr_study", "epochs=1,2"], 17),
    (["+mlflow.tags.team=a,b", "hidden=8,16"], 2),  # + keys: Hydra composes each value once
    (["data.n_train=null,100", "data.dir=null", "hidden=8,16"], 3),
    (["hidden=8,16", "lr=0.1,0.2", "hydra.sweep.subdir=${hydra.job.override_dirname}"], 3),
    (["hidden=16,16", "seed=${hydra.job.num}"], 1),  # a duplicated point; a trainer key reading hydra
    (["model.init=fan_in,course", "data.scale=unit,byte", "check.reference=false"], 3),
]


@pytest.mark.parametrize(("args", "fast_points"), SWEEPS)
def test_fast_composition_equals_hydras(loader, args, fast_points):
    master, points = grid(loader, args)
    composer = PointComposer(loader, master)
    for num, overrides in enumerate(points):
        slow = numbered(loader.load_sweep_config(master, overrides), num)
        fast = numbered(composer.compose(overrides), num)
        # The whole config, hydra section included, as Hydra composes it for this job.
        assert OmegaConf.to_container(fast) == OmegaConf.to_container(slow), overrides
        assert OmegaConf.is_struct(fast) and not OmegaConf.is_readonly(fast.hydra)
        assert fast.hydra.sweep.subdir == slow.hydra.sweep.subdir
        assert list(fast.hydra.overrides.task) == [o for o in overrides if not o.startswith("hydra.")]
        assert_same_trainer(trainer_config(fast), old_trainer_config(slow))
    assert composer.fast == fast_points


def test_subdir_from_override_dirname(loader):
    master, points = grid(loader, ["hidden=8,16", "lr=0.1", "hydra.sweep.subdir=${hydra.job.override_dirname}"])
    composer = PointComposer(loader, master)
    subdirs = [numbered(composer.compose(p), i).hydra.sweep.subdir for i, p in enumerate(points)]
    assert subdirs == ["hidden=8,lr=0.1", "hidden=16,lr=0.1"] and composer.fast == 1


def test_handed_out_configs_are_independent(loader):
    master, points = grid(loader, ["hidden=8,16,32"])
    composer = PointComposer(loader, master)
    first = composer.compose(points[0])
    first.hidden = 999  # a caller's change must not leak into later points
    assert [composer.compose(p).hidden for p in points[1:]] == [16, 32]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["hidden=8,abc"], "Value 'abc' of type 'str' could not be converted to Integer"),
        (["lr=0.1,abc", "hidden=8"], "Value 'abc' of type 'str' could not be converted to Float"),
        (["dtype=float32,float16"], "Invalid value 'float16', expected one of [float32, float64]"),
        (["data.n_train=5,x"], "Value 'x' of type 'str' could not be converted to Integer"),
        (["nproc=1,null"], "field 'nproc' is not Optional"),
    ],
)
def test_bad_value_in_a_later_point_fails_with_hydras_message(loader, args, message):
    master, points = grid(loader, args)
    composer = PointComposer(loader, master)
    composer.compose(points[0])
    with pytest.raises(ConfigCompositionException) as slow:
        loader.load_sweep_config(master, points[1])
    with pytest.raises(ConfigCompositionException) as fast:
        composer.compose(points[1])
    assert composer.fast == 1  # the fast path itself refused it
    assert str(fast.value) == str(slow.value)
    assert str(fast.value.__cause__) == str(slow.value.__cause__)
    assert message in str(fast.value.__cause__)


def test_trainer_config_matches_the_old_one_on_defaults_and_presets(loader, monkeypatch):
    monkeypatch.setenv("SWEEPSCALE_MNIST", "~/mnist")  # data.dir expands and resolves the same
    for args in ([], ["+experiment=hidden_study"], ["data.dir=rel/dir", "+mlflow.tags.a=b"]):
        cfg = numbered(loader.load_configuration("sweep", args, run_mode=RunMode.RUN), 0)
        assert_same_trainer(trainer_config(cfg), old_trainer_config(cfg))


def test_sweeper_checks_batches_with_hydras_errors(loader):
    from types import SimpleNamespace

    from hydra_plugins.sweepscale_launcher.launcher import SweepscaleLauncher
    from hydra_plugins.sweepscale_launcher.sweeper import SweepscaleSweeper

    sweeper = SweepscaleSweeper(max_batch_size=None, params=None)
    master, points = grid(loader, ["hidden=8,16"])
    sweeper.hydra_context, sweeper.config = SimpleNamespace(config_loader=loader), master
    sweeper.launcher = SweepscaleLauncher()
    sweeper.validate_batch_is_legal(points)
    # The launcher composes the points from the check's templates: Hydra composed the first one only.
    composer = sweeper.launcher.composer
    assert composer is not None and composer.fast == 1
    first = numbered(composer.compose(points[0]), 0)
    assert composer.fast == 2
    slow = numbered(loader.load_sweep_config(master, list(points[0])), 0)
    assert OmegaConf.to_container(first) == OmegaConf.to_container(slow)
    with pytest.raises(ConfigCompositionException) as e:
        sweeper.validate_batch_is_legal([["hidden=8"], ["hidden=abc"]])
    assert "Value 'abc' of type 'str' could not be converted to Integer" in str(e.value.__cause__)
