"""``python -m trainer [overrides]``: one training run, e.g. ``python -m trainer hidden=64``."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from trainer.config import register
from trainer.run import main as run_main

register()


@hydra.main(config_path="../conf", config_name="trainer", version_base="1.3")
def main(cfg: DictConfig) -> None:
    status = run_main(cfg, sys.argv[1:])  # the ranks re-read exactly what this process was given
    if status:
        sys.exit(status)


if __name__ == "__main__":
    main()
