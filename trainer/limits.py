"""What a run may ask of the machine it is planned on (memory, folders to write): checked
before anything starts."""

from __future__ import annotations

import contextlib
import os
import resource
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
    """The memory this process may use: the machine's, or less where a limit says (``ulimit -v``,
    a cgroup's memory.max as Slurm and containers set it)."""
    found = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        found.append(soft)
    try:
        cgroup = Path("/proc/self/cgroup").read_text().strip().split("::")[-1]
        text = Path(f"/sys/fs/cgroup{cgroup}/memory.max").read_text().strip()
        if text.isdigit():
            found.append(int(text))
    except OSError:  # no cgroup v2 here
        pass
    return min(found)


def too_big(hidden: int, dtype: str) -> str:
    return (
        f"hidden={hidden}: the weights and their copies would take {weight_bytes(hidden, dtype) / 2**30:.1f} GiB, "
        f"more than the {machine_memory() / 2**30:.1f} GiB of memory this process may use; lower hidden"
    )


def check_writable(key: str, folder: str) -> None:
    """A folder the run writes into after training (created if missing) must take a file: found
    now, not after the training it would waste. A test beats os.access (read-only mounts, /proc)."""
    path = Path(folder).expanduser()
    made = [p for p in (path, *path.parents) if not p.exists()]  # deepest first: removed after the test
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        raise ConfigError(f"{key}={folder}: cannot write there ({e.strerror}); point it at a writable folder") from None
    finally:  # a dry run or a refused sweep leaves no empty folder; the run makes it when it writes
        for p in made:
            with contextlib.suppress(OSError):
                p.rmdir()


def check_folders(cfg: Any) -> None:
    """The folders a run of ``cfg`` (a TrainerConfig) writes: the reference cache, the checkpoints."""
    if cfg.check.reference:
        check_writable("check.cache_dir", cfg.check.cache_dir)
    if cfg.save.checkpoint_dir is not None:
        check_writable("save.checkpoint_dir", cfg.save.checkpoint_dir)
