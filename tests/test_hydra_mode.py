"""Our CLIs read Hydra's run mode from the command line (trainer/hydra_mode.py) instead of composing
the config once more for it: the same mode Hydra's own get_mode composes, for our configs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hydra import initialize_config_dir
from hydra._internal.hydra import Hydra
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

from sweeper.config import register
from tests.conftest import ROOT
from trainer.hydra_mode import compose_once, mode_from_overrides

CASES = [
    [],
    ["hidden=8,16", "nproc=1,2"],
    ["hydra.mode=RUN"],
    ["hydra.mode=MULTIRUN", "hidden=8"],
    ["++hydra.mode=MULTIRUN"],
    ["hydra.mode=RUN", "hydra.mode=MULTIRUN"],
    ["hydra.mode=bogus"],
    ["+hydra.mode=RUN"],
    ["hydra.mode=RUN", "~hydra.mode"],
    ["hiden=3"],
]


@pytest.fixture(scope="module")
def hydra() -> Iterator[Any]:
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        yield GlobalHydra.instance().hydra


def composed_mode(hydra: Any, config_name: str, overrides: list[str]) -> RunMode | None:
    """Hydra 1.3's get_mode, as written there: the whole config composed for its hydra.mode."""
    try:
        cfg = hydra.compose_config(
            config_name=config_name,
            overrides=list(overrides),
            with_log_configuration=False,
            run_mode=RunMode.MULTIRUN,
            validate_sweep_overrides=False,
        )
        return cfg.hydra.mode
    except Exception:
        return None


@pytest.mark.parametrize("config_name", ["trainer", "sweep"])
@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o) or "none")
def test_the_mode_read_from_the_command_line_is_the_one_hydra_composes(hydra, config_name, overrides):
    assert mode_from_overrides(overrides) == composed_mode(hydra, config_name, overrides)


def test_after_compose_once_hydra_asks_the_mode_without_composing(hydra, monkeypatch):
    monkeypatch.setattr(Hydra, "get_mode", Hydra.get_mode)  # put back after the test

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("get_mode composed the config")

    monkeypatch.setattr(Hydra, "compose_config", refuse)
    compose_once()
    assert hydra.get_mode("sweep", ["hydra.mode=RUN", "hidden=8,16"]) == RunMode.RUN
    assert hydra.get_mode("trainer", ["hidden=8"]) is None  # Hydra then takes the -m flag's
