"""``python -m trainer [overrides]``: one training run, e.g. ``python -m trainer hidden=64``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trainer.errors import ConfigError
from trainer.lifecycle import launch
from trainer.override_checks import check_old_keys, note_repeated
from trainer.ranks import parallel
from trainer.ranks.processes import run_then_exit
from trainer.run import main as run_main
from trainer.worker_points import load_values


def hydra_main() -> None:
    """The run as Hydra composes it from the command line. Hydra is imported here: the ranks that
    ``python -m trainer nproc=N`` starts load the config it composed, and need none of it."""
    import hydra
    from omegaconf import DictConfig

    from trainer.config import register
    from trainer.hydra_mode import compose_once

    register()
    compose_once()

    @hydra.main(config_path="../conf", config_name="trainer", version_base="1.3")
    def main(cfg: DictConfig) -> None:
        status = run_main(cfg, sys.argv[1:])  # the ranks get the same argv (ps shows it) and load cfg as composed
        if status:
            sys.exit(status)

    main()


if __name__ == "__main__":
    if parallel.launched_by_mpi() and os.environ.get(launch.CONFIG_FILE):  # a rank of launch_ranks: its
        sys.exit(run_main(load_values(Path(os.environ[launch.CONFIG_FILE])), sys.argv[1:]))  # overrides checked there
    try:
        check_old_keys(sys.argv[1:])  # moved keys (tf32=true, step=fused, ...) fail before anything starts
        note_repeated(sys.argv[1:])
        if any(a in ("-m", "--multirun") for a in sys.argv[1:]):  # its ranks would each run the whole sweep
            raise ConfigError("python -m trainer runs one config; sweep with python -m sweeper -m (the same overrides)")
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(2)
    # A rank ends the usual way: ended at once, its world was now and then killed by MPICH's mpiexec.
    if parallel.launched_by_mpi():  # started by hand: mpiexec -n 2 python -m trainer nproc=2 ...
        hydra_main()
    else:
        run_then_exit(hydra_main)  # without Python's teardown: a second of the command's time
