"""A search's space from Hydra's override grammar, as Optuna's distributions (pure: no I/O).

    lr=tag(log,interval(0.001,1))   a float on a log scale      hidden=choice(64,128)   categorical
    momentum=interval(0,0.9)        a float                     nproc=1,2               categorical
    hidden=tag(int,interval(16,256)) an integer                 hidden=range(16,80,16)  integers, stepped

Overrides without a sweep stay fixed for every trial. The rules follow Hydra's own Optuna sweeper
(hydra_plugins.hydra_optuna_sweeper), so a command line means the same under both.
"""

from __future__ import annotations

from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep

from trainer.errors import ConfigError


def split(arguments: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The search's space (key -> Optuna distribution) and the fixed overrides, in their order."""
    space: dict[str, Any] = {}
    fixed: list[str] = []
    for override in OverridesParser.create().parse_overrides(arguments):
        if override.is_sweep_override():
            space[override.get_key_element()] = distribution(override)
        else:
            fixed.append(override.input_line)
    if not space:
        raise ConfigError(
            "a search needs at least one value to search, e.g. 'lr=tag(log,interval(0.001,1))' or "
            "hidden=choice(64,128); without one, run a grid: drop hydra/sweeper=search"
        )
    return space, fixed


def distribution(override: Override) -> Any:
    """An Optuna distribution for one sweep override."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    key, value = override.get_key_element(), override.value()
    if isinstance(value, ChoiceSweep):
        return CategoricalDistribution(list(override.sweep_iterator()))
    if isinstance(value, RangeSweep):
        ints = all(float(x).is_integer() for x in (value.start, value.stop, value.step))
        if not ints or value.step <= 0:
            return CategoricalDistribution(list(override.sweep_iterator()))
        last = int(value.stop) - 1 - (int(value.stop) - 1 - int(value.start)) % int(value.step)
        return IntDistribution(int(value.start), last, step=int(value.step))
    if isinstance(value, IntervalSweep):
        low, high, log = value.start, value.end, "log" in value.tags
        if low >= high:
            said = override.input_line.split("=", 1)[1]
            raise ConfigError(
                f"{key}={said}: an interval runs from its low end to a higher one, e.g. interval(0.01,0.5)"
            )
        if log and low <= 0:
            raise ConfigError(f"{key}={override.input_line.split('=', 1)[1]}: a log scale needs a low end above 0")
        if "int" in value.tags:
            return IntDistribution(int(low), int(high), log=log)
        return FloatDistribution(float(low), float(high), log=log)
    raise ConfigError(f"{override.input_line}: a search takes choice, range or interval sweeps")


def label(params: dict[str, Any]) -> list[str]:
    """A trial's values as its name shows them: floats to 4 significant digits (its overrides, its
    config and its run's params keep every digit)."""
    return [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()]


def overrides(params: dict[str, Any]) -> list[str]:
    """A trial's values as Hydra overrides, e.g. ["lr=0.0123", "nproc=2"]."""
    return [f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}" for key, value in params.items()]
