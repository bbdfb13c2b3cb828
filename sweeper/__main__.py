"""``python -m sweeper -m hidden=512,1024 nproc=1,2``: one job per point, recorded in MLflow.

``--dry-run`` previews the points and their resources; ``--force`` reruns finished points.
They are shorthands for the overrides sweep.dry_run=true and sweep.force=true.
"""

from __future__ import annotations

import signal
import sys

# Before the imports (a second or more on a busy machine): SIGTERM interrupts the sweeper as Ctrl-C
# does, its default ended it at once (no run ended, no report), and a SIGINT inherited ignored
# (nohup, a background job, a test harness) interrupts it too. sweeper/sweep.py ends what started.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.default_int_handler)


def cli() -> None:
    import hydra
    from omegaconf import DictConfig

    from sweeper.config import FLAGS, register, reject_renamed
    from trainer.errors import ConfigError
    from trainer.hydra_mode import compose_once
    from trainer.override_checks import check_old_keys, check_repeated
    from trainer.ranks.processes import run_then_exit

    register()
    compose_once()

    @hydra.main(config_path="../conf", config_name="sweep", version_base="1.3")
    def main(cfg: DictConfig) -> None:
        """Runs only without -m: a sweep needs Hydra's multirun, which hands points to our launcher."""
        print("sweepscale: add -m to sweep, e.g. python -m sweeper -m hidden=512,1024 nproc=1,2", file=sys.stderr)
        sys.exit(2)

    sys.argv = [FLAGS.get(a, a) for a in sys.argv]
    if any(a in ("-m", "--multirun") for a in sys.argv[1:]):  # anywhere: Hydra wants its flags before overrides
        sys.argv = [sys.argv[0], "-m", *(a for a in sys.argv[1:] if a not in ("-m", "--multirun"))]
    try:  # old spellings stop here, before Hydra, naming the new key
        check_old_keys(sys.argv[1:])  # the trainer's moved keys (tf32=true -> gpu.gemm=tf32): its one call site here
        check_repeated(sys.argv[1:])
        reject_renamed(sys.argv[1:])  # the launcher's renamed keys (launcher.time_min -> launcher.timeout_min)
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(2)
    run_then_exit(main)  # without Python's teardown: a second of the command's time


if __name__ == "__main__":
    try:
        cli()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM before any worker started (sweeper/sweep.py ends those)
        from trainer.ranks.processes import exit_now

        print("interrupted: the sweep stopped before anything ran", file=sys.stderr)
        exit_now(130)
