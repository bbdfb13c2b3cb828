"""Hydra's BasicSweeper, checking each batch with PointComposer rather than recomposing every point.

BasicSweeper.validate_batch_is_legal composes every point with load_sweep_config before launching
(as much again as the launcher's composition used to cost, issue #19). sweeper/config.py registers
it as hydra/sweeper=sweepscale, which conf/sweep.yaml selects.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper


class SweepscaleSweeper(BasicSweeper):
    def sweep(self, arguments: list[str]) -> Any:
        """BasicSweeper's, in the sweep's folder claimed (claim_sweep_folder)."""
        from sweeper.folders import release_folder

        folder = claim_sweep_folder(self.config)
        try:
            return super().sweep(arguments)
        except BaseException:  # refused before any point ran (a bad override): no empty folder left
            release_folder(folder)
            raise

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """The same early check, the same errors: every point composed, most by the fast path."""
        from hydra_plugins.sweepscale_launcher.compose import PointComposer
        from hydra_plugins.sweepscale_launcher.launcher import SweepscaleLauncher
        from sweeper.folders import release_folder

        composer = PointComposer(self.hydra_context.config_loader, self.config)
        try:
            for overrides in batch:
                composer.compose(list(overrides))
        except BaseException:  # refused (an unknown key, a value of the wrong type): the folder Hydra made goes
            release_folder(Path(str(self.config.hydra.sweep.dir)))
            raise
        if isinstance(self.launcher, SweepscaleLauncher):  # its points from these templates: no first one again
            self.launcher.composer = composer


def claim_sweep_folder(config: Any) -> Path:
    """The sweep's folder, once known to take files (Hydra would fail writing its multirun.yaml
    there with a traceback naming no key) and this sweep's alone: another started in the same
    second gets the next one. The launcher shares ``config``: it finds the folder claimed."""
    from omegaconf import open_dict

    from sweeper.folders import claim_folder
    from trainer.errors import ConfigError
    from trainer.limits import check_writable

    try:
        check_writable("hydra.sweep.dir", str(config.hydra.sweep.dir))
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(2)
    folder = claim_folder(Path(str(config.hydra.sweep.dir)).resolve())
    with open_dict(config):
        config.hydra.sweep.dir = str(folder)
    return folder
