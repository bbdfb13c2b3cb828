"""sweepscale's Hydra launcher: Hydra expands the grid, the sweeper does the rest.

Hydra's stock launchers give every point of a multirun the same resources; this one composes
each point, then hands all of them to sweeper.sweep.run_sweep, which groups them by shape.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf, open_dict


class SweepscaleLauncher(Launcher):
    def __init__(self, **_: Any) -> None:
        self.config: DictConfig | None = None
        self.hydra_context: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra_plugins.sweepscale_launcher.compose import PointComposer
        from sweeper.folders import DISK_FULL, claim_folder, note_end, release_folder
        from sweeper.plan import trainer_config
        from sweeper.points import Point, labels
        from sweeper.sweep import run_sweep
        from sweeper.timeline import phase
        from trainer.errors import ConfigError, disk_full

        sweep_dir = claim_folder(Path(str(self.config.hydra.sweep.dir)).resolve())
        points = []
        names = labels([list(o) for o in job_overrides])
        # Hydra's load_sweep_config for each point, without recomposing what points share (issue #19).
        composer = PointComposer(self.hydra_context.config_loader, self.config)
        try:
            with phase("compose points"):
                for i, overrides in enumerate(job_overrides):
                    cfg = composer.compose(list(overrides))
                    with open_dict(cfg):
                        cfg.hydra.job.num = initial_job_idx + i
                    subdir = str(OmegaConf.select(cfg, "hydra.sweep.subdir"))
                    point = Point(
                        initial_job_idx + i, list(overrides), trainer_config(cfg), sweep_dir / subdir, names[i]
                    )
                    points.append(point)
            status = run_sweep(self.config, points, sweep_dir, list(self.config.hydra.overrides.task))
        except ConfigError as e:
            release_folder(sweep_dir)  # refused before anything started: no empty sweep folder left
            print(f"Error: {e}", file=sys.stderr)
            sys.exit(2)
        except BaseException as e:  # Hydra's own refusals (an unknown key, a value of the wrong type), Ctrl-C
            release_folder(sweep_dir)
            if full := disk_full(e):  # a line, not MLflow's and SQLAlchemy's tracebacks
                note_end(sweep_dir, f"its sweeper stopped: the disk was full ({full})")
                print(f"Error: {DISK_FULL.format(folder=sweep_dir, error=full)}", file=sys.stderr)
                sys.exit(1)
            raise
        if status:
            sys.exit(status)
        return [
            JobReturn(overrides=list(p.overrides), cfg=p.trainer, status=JobStatus.COMPLETED, _return_value=0)
            for p in points
        ]
