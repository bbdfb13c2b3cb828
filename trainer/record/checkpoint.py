"""Per-epoch checkpoints: what a requeued, preempted or time-limited run resumes from.

Rank 0 writes ``checkpoint.npz`` in ``save.checkpoint_dir`` after every epoch, atomically (a
temporary file, then a rename), before it logs the epoch's metrics: a process killed at any
moment leaves either the previous checkpoint or this one, never half of one. It holds the flat
weights, the epochs and global steps done, the MLflow run's id, the key of the config that
computes them, the last epoch's result, which a resumed run logs again if the store never got
it, the seconds the run has held its devices so far (its GPU- or core-seconds count every
allocation it trained in), and the weights the CPU check compares once they were taken
(trainer/lifecycle/check.py). No random state is kept because none evolves: the initial weights
and each epoch's shuffle are drawn from ``seed`` alone (model.init_params, loop.epoch_order), so
epoch k+1 from a checkpoint of epoch k updates exactly as the uninterrupted run does.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainer.errors import ConfigError

FILE = "checkpoint.npz"


@dataclass
class Checkpoint:
    params: np.ndarray  # flat weights after ``epoch`` epochs
    epoch: int  # epochs done
    iteration: int  # global steps done
    run_id: str  # the MLflow run the resumed training goes on recording into
    key: str  # resume_key of the config: a checkpoint of another config is refused
    losses: np.ndarray  # the last epoch's mini-batch losses, its batch sizes, seconds and precision
    batch_sizes: np.ndarray
    seconds: float
    precision: float  # NaN without a test set
    snapshot: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the weights the CPU check compares, once taken
    held_s: float = 0.0  # seconds the run has held its devices, over every run of its job up to this checkpoint
    training_s: float = 0.0  # the part its epochs took


def resume_key(cfg: Any) -> str:
    """What the weights depend on: the config's hash without the fault to inject (a run killed by
    an injected fault resumes without it)."""
    from trainer.record.identity import config_hash

    return config_hash(cfg, ignore=("fault",))


def path(folder: str | os.PathLike) -> Path:
    return Path(folder).expanduser() / FILE


def save(folder: str | os.PathLike, ckpt: Checkpoint) -> None:
    """Write atomically: the rename replaces the previous checkpoint only once this one is whole."""
    target = path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", suffix=".npz", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{k: np.asarray(v) for k, v in vars(ckpt).items()})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(folder: str | os.PathLike | None, key: str) -> Checkpoint | None:
    """The checkpoint in ``folder``, None if there is none; a ConfigError if it is another config's."""
    if folder is None or not path(folder).exists():
        return None
    with np.load(path(folder)) as z:
        fields = {k: z[k] for k in z.files}
    ckpt = Checkpoint(
        params=fields["params"],
        epoch=int(fields["epoch"]),
        iteration=int(fields["iteration"]),
        run_id=str(fields["run_id"]),
        key=str(fields["key"]),
        losses=fields["losses"],
        batch_sizes=fields["batch_sizes"],
        seconds=float(fields["seconds"]),
        precision=float(fields["precision"]),
        snapshot=fields.get("snapshot", np.zeros(0)),
        held_s=float(fields.get("held_s", 0.0)),
        training_s=float(fields.get("training_s", 0.0)),
    )
    if ckpt.key != key:
        raise ConfigError(
            f"save.checkpoint_dir={folder}: its checkpoint is of another config (key {ckpt.key}, this one "
            f"{key}); delete {path(folder)} or point save.checkpoint_dir at another folder"
        )
    return ckpt


def remove(folder: str | os.PathLike | None) -> None:
    """The run ended FINISHED: nothing is left to resume."""
    if folder is not None:
        path(folder).unlink(missing_ok=True)
