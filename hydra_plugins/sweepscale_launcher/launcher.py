"""sweepscale's Hydra launcher: Hydra expands the grid, the sweeper does the rest.

Hydra's stock launchers give every point of a multirun the same resources; this one composes
each point, then hands all of them to sweeper.sweep.run_sweep, which groups them by shape. A
search (hydra/sweeper=search, search.py here) asks it for points one trial at a time instead.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf, open_dict


class SweepscaleLauncher(Launcher):
    def __init__(self, **_: Any) -> None:
        self.config: DictConfig | None = None
        self.hydra_context: Any = None
        self.composer: Any = None  # the sweeper's, where it composed the batch to check it (sweeper.py)

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra_plugins.sweepscale_launcher.compose import PointComposer
        from sweeper.plan.source import GridSource
        from sweeper.points import labels
        from sweeper.sweep import run_sweep
        from sweeper.timeline import phase

        points = []
        names = labels([list(o) for o in job_overrides])
        # Hydra's load_sweep_config for each point, without recomposing what points share (issue #19).
        composer = self.composer or PointComposer(self.hydra_context.config_loader, self.config)
        with self.sweep_folder() as sweep_dir:
            with phase("compose points"):
                for i, overrides in enumerate(job_overrides):
                    points.append(compose_point(composer, initial_job_idx + i, list(overrides), names[i], sweep_dir))
            status = run_sweep(self.config, GridSource(points), sweep_dir, list(self.config.hydra.overrides.task))
        if status:
            sys.exit(status)
        return [
            JobReturn(overrides=list(p.overrides), cfg=p.trainer, status=JobStatus.COMPLETED, _return_value=0)
            for p in points
        ]

    def search(self, arguments: list[str], options: Any) -> None:
        """Run a search (sweeper/search/study.py): its points composed as the study asks for them."""
        from hydra_plugins.sweepscale_launcher.compose import PointComposer
        from sweeper.search.flow import SearchSource
        from sweeper.search.study import Search
        from sweeper.sweep import run_sweep
        from trainer import metrics
        from trainer.record import store

        composer = PointComposer(self.hydra_context.config_loader, self.config)
        with self.sweep_folder() as sweep_dir:

            def make_point(index: int, overrides: list[str], name: str) -> Any:
                point = compose_point(composer, index, overrides, name, sweep_dir)
                with open_dict(point.trainer):
                    point.trainer.mlflow.tags = {**point.trainer.mlflow.tags, metrics.TAG_TRIAL: str(index)}
                    point.trainer.save.progress_dir = str(point.dir.resolve())  # read between epochs (pruning)
                return point

            uri = store.absolute_uri(store.tracking_uri(self.config.mlflow.tracking_uri))
            options.target = self.config.report.target  # objective=time_to_target's test precision
            search = Search(arguments, options, uri, make_point)
            status = run_sweep(self.config, SearchSource(search), sweep_dir, list(self.config.hydra.overrides.task))
        if status:
            sys.exit(status)

    @contextlib.contextmanager
    def sweep_folder(self) -> Iterator[Path]:
        """The sweep's folder, claimed; released again after a preview (--dry-run), and (with a clear
        line, exit 2) where the sweep is refused before anything started; on a full disk a line, exit 1."""
        from sweeper.folders import (
            CLOSED,
            DISK_FULL,
            LEFT_RUNNING,
            DiskFullError,
            claim_folder,
            free_reserve,
            note_end,
            release_folder,
        )
        from trainer.errors import ConfigError, disk_full

        sweep_dir = claim_folder(Path(str(self.config.hydra.sweep.dir)).resolve())
        try:
            yield sweep_dir
            if self.config.sweep.dry_run:  # a preview ran nothing: no folder left behind
                release_folder(sweep_dir)
        except ConfigError as e:
            release_folder(sweep_dir)  # refused before anything started: no empty sweep folder left
            print(f"Error: {e}", file=sys.stderr)
            sys.exit(2)
        except BaseException as e:  # Hydra's own refusals (an unknown key, a value of the wrong type), Ctrl-C
            release_folder(sweep_dir)
            if full := disk_full(e):  # a line, not MLflow's and SQLAlchemy's tracebacks
                closed = isinstance(e, DiskFullError) and e.closed
                if not closed:  # the next sweep closes what this one left RUNNING, saying why
                    note_end(sweep_dir, f"its sweeper stopped: the disk was full ({full})")
                said = DISK_FULL.format(folder=sweep_dir, error=full, closed=CLOSED if closed else LEFT_RUNNING)
                print(f"Error: {said}", file=sys.stderr)
                sys.exit(1)
            raise
        finally:
            free_reserve(sweep_dir)  # the sweep has ended: its reserve back to the disk


def compose_point(composer: Any, index: int, overrides: list[str], name: str, sweep_dir: Path) -> Any:
    """Point ``index`` of the sweep: its config composed by Hydra's rules, its folder Hydra's subdir."""
    from sweeper.plan.shapes import trainer_config
    from sweeper.points import Point

    cfg = composer.compose(overrides)
    with open_dict(cfg):
        cfg.hydra.job.num = index
    subdir = str(OmegaConf.select(cfg, "hydra.sweep.subdir"))
    return Point(index, overrides, trainer_config(cfg), sweep_dir / subdir, name)
