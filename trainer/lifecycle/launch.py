"""The process that starts a standalone run's ranks (``python -m trainer nproc=N``) and answers
for its run should a rank die: the other ranks cannot end it then, and MLflow would show it
RUNNING forever."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from trainer import metrics
from trainer.ranks import parallel
from trainer.record import store

RUN_ID_FILE = "SWEEPSCALE_RUN_ID_FILE"  # where rank 0 writes its run's id for the process that started the ranks
# The launcher's composed config, its values resolved: each rank types it (trainer/worker_points.py)
# instead of composing the overrides with Hydra again, 0.6 CPU-s a rank.
CONFIG_FILE = "SWEEPSCALE_CONFIG_FILE"


def launch_ranks(cfg: Any, argv: list[str]) -> int:
    """Start the nproc ranks with mpiexec and wait; a run they left RUNNING (a rank killed: the
    others cannot end it) ends FAILED here, with the cause."""
    mpiexec = parallel.find_mpiexec(cfg.mpi.mpiexec)
    with tempfile.TemporaryDirectory(prefix="sweepscale-") as d:
        values = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        Path(d, "config.json").write_text(json.dumps(values))
        os.environ.update({RUN_ID_FILE: f"{d}/run_id", CONFIG_FILE: f"{d}/config.json"})
        try:
            status = parallel.run_under_mpiexec(mpiexec, cfg.nproc, argv)
        finally:
            for key in (RUN_ID_FILE, CONFIG_FILE):
                del os.environ[key]
        run_id = Path(d, "run_id").read_text() if Path(d, "run_id").exists() else None
    if status and run_id:
        end_left_running(store.tracking_uri(cfg.mlflow.tracking_uri), run_id, status)
    return status


def end_left_running(uri: str, run_id: str, status: int) -> None:
    """End the run FAILED, saying why, unless the ranks ended it."""
    client = store.client(uri)
    if client.get_run(run_id).info.status != "RUNNING":
        return  # the ranks ended it themselves (an error, Ctrl-C)
    cause = f"a rank died before the run ended: mpiexec exited with status {status}"
    number = status - 128 if status > 128 else status  # MPICH reports a rank killed by signal N as N
    if number in {s.value for s in signal.Signals}:
        cause += f" (signal {number}, {signal.Signals(number).name}, if a rank was killed by one)"
    print(f"run {run_id} FAILED: {cause}", file=sys.stderr)
    client.set_tag(run_id, metrics.TAG_ERROR, cause)
    client.set_terminated(run_id, "FAILED")


def tell_launcher(run_id: str | None) -> None:
    """Rank 0, once its run exists: the id, for the process that started the ranks."""
    if run_id and os.environ.get(RUN_ID_FILE):
        Path(os.environ[RUN_ID_FILE]).write_text(run_id)
