"""What a point's job runs (each Slurm task runs it too). Standard library only: every job
imports this module to unpickle its function, so it must start fast."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

POINT_CONFIG = "point"


class PointFailedError(RuntimeError):
    """The trainer of a point exited with a non-zero status."""


def run_point(config_dir: str, env: dict[str, str]) -> int:
    """The job's body (every Slurm task runs it): start the trainer, pass signals on."""
    cmd = [sys.executable, "-m", "trainer", "--config-dir", config_dir, "--config-name", POINT_CONFIG]
    # srun's PMI hands each task a socket (PMI_FD); the trainer, not this wrapper, is the rank.
    keep = (int(os.environ["PMI_FD"]),) if "PMI_FD" in os.environ else ()
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, pass_fds=keep)

    def forward(signum: int, _frame: Any) -> None:
        proc.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(s, forward)
    status = proc.wait()
    if status:
        raise PointFailedError(f"trainer exited with status {status} (config {config_dir}/{POINT_CONFIG}.yaml)")
    return 0
