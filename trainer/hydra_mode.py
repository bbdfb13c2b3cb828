"""Hydra's run mode read from the command line, so a CLI composes its config once, not twice.

Before each run or multirun, Hydra 1.3's ``_run_hydra`` calls ``Hydra.get_mode``, which composes
the whole config only to read ``hydra.mode`` and throws the config away (hydra-ecosystem/hydra#3440):
0.3 CPU-s of every ``python -m trainer`` and ``python -m sweeper``. Our configs never set
``hydra.mode`` (tests/test_hydra_mode.py asks Hydra's own get_mode), so the mode is the command
line's ``hydra.mode=`` or, as Hydra does when get_mode finds none, the ``-m`` flag's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.types import RunMode


def mode_from_overrides(overrides: Sequence[str]) -> RunMode | None:
    """``hydra.mode`` as the overrides set it (the last one wins, as in Hydra), else None."""
    for line in reversed(overrides):
        key, sep, value = line.partition("=")
        if key == "~hydra.mode":  # deleted: none, as Hydra's composition leaves
            return None
        if sep and key.lstrip("+") == "hydra.mode":
            # A value Hydra would refuse: None here, and the one composition names it in Hydra's words.
            return RunMode.__members__.get(value.strip())
    return None


def compose_once() -> None:
    """Hydra's get_mode without its composition, for this process's CLI (before ``@hydra.main`` runs)."""
    from hydra._internal.hydra import Hydra

    def get_mode(self: Any, config_name: str | None, overrides: list[str]) -> RunMode | None:
        return mode_from_overrides(overrides)

    Hydra.get_mode = get_mode  # type: ignore[method-assign]
