"""hydra/sweeper=search: an asynchronous Optuna search over Hydra's override grammar.

Where Hydra's Optuna sweeper launches trials in batches and waits for each batch's slowest, this
sweeper hands the whole search to sweepscale's launcher, which asks the study for a trial each time
a warm worker frees (sweeper/search/study.py). sweeper/config.py registers its schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf


class SearchSweeper(Sweeper):
    def __init__(
        self,
        n_trials: int,
        objective: str,
        direction: Any = None,
        study_name: str | None = None,
        storage: str | None = None,
        seed: int | None = None,
        pruner: Any = "none",
        prune_threshold: float | None = None,
    ) -> None:
        from sweeper.search.options import SearchOptions

        direction, pruner = (str(getattr(v, "name", v)) for v in (direction, pruner))  # the schema's enums
        self.options = SearchOptions(n_trials, objective, direction, study_name, storage, seed, pruner, prune_threshold)
        self.config: DictConfig | None = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from hydra_plugins.sweepscale_launcher.sweeper import claim_sweep_folder

        folder = claim_sweep_folder(self.config)
        OmegaConf.save(self.config, folder / "multirun.yaml")  # as Hydra's own sweepers keep it
        self.launcher.search(list(arguments), self.options)
        return []

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        pass  # the search checks the ends of its space before anything starts (sweeper/search/study.py corners)
