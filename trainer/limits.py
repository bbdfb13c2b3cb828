"""What a run may ask of the machine it is planned on (memory, folders to write): checked
before anything starts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError

MAX_PIXELS = 28 * 28  # the widest input the data sets have (MNIST); the embedded digits have fewer
COPIES = 4  # the weights, the gradient, the initial weights kept for the reference, the reference's


def weight_bytes(hidden: int, dtype: str) -> int:
    """What the weights of a run take, with the copies a run keeps (an upper bound: MNIST's pixels)."""
    n = (MAX_PIXELS + 1) * hidden + (hidden + 1) * 10
    return COPIES * n * (8 if dtype == "float64" else 4)


def machine_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def too_big(hidden: int, dtype: str) -> str:
    return (
        f"hidden={hidden}: the weights and their copies would take {weight_bytes(hidden, dtype) / 2**30:.1f} GiB, "
        f"more than this machine's {machine_memory() / 2**30:.0f} GiB of memory; lower hidden"
    )


def check_writable(key: str, folder: str) -> None:
    """A folder the run writes into after training (created if missing) must take a file: found
    now, not after the training it would waste. A test beats os.access (read-only mounts, /proc)."""
    try:
        Path(folder).expanduser().mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=Path(folder).expanduser()).close()
    except OSError as e:
        raise ConfigError(f"{key}={folder}: cannot write there ({e.strerror}); point it at a writable folder") from None


def check_folders(cfg: Any) -> None:
    """The folders a run of ``cfg`` (a TrainerConfig) writes: the reference cache, the checkpoints."""
    if cfg.check.reference:
        check_writable("check.cache_dir", cfg.check.cache_dir)
    if cfg.save.checkpoint_dir is not None:
        check_writable("save.checkpoint_dir", cfg.save.checkpoint_dir)
