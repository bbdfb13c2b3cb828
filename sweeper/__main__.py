"""``python -m sweeper -m hidden=512,1024 nproc=1,2``: one job per point, recorded in MLflow.

``--dry-run`` previews the points and their resources; ``--force`` reruns finished points.
They are shorthands for the overrides sweep.dry_run=true and sweep.force=true.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from sweeper.config import FLAGS, register

register()


@hydra.main(config_path="../conf", config_name="sweep", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Runs only without -m: a sweep needs Hydra's multirun, which hands points to our launcher."""
    print("sweepscale: add -m to sweep, e.g. python -m sweeper -m hidden=512,1024 nproc=1,2", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    sys.argv = [FLAGS.get(a, a) for a in sys.argv]
    main()
