"""A data set's training arrays in shared memory, for the CPU references' children
(trainer/lifecycle/reference_jobs.py): copied there once per data set by the process that asks
for references, mapped by each child without a copy, freed when that process's pool ends."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np


@dataclass(frozen=True)
class SharedArray:
    """An array in shared memory, as a child finds it."""

    name: str
    shape: tuple[int, ...]
    dtype: str


# In this process: the training arrays of each data set a reference was asked of, by fingerprint.
_shared: dict[str, tuple[list[shared_memory.SharedMemory], tuple[SharedArray, SharedArray]]] = {}
_shared_lock = threading.Lock()
_attached: dict[str, shared_memory.SharedMemory] = {}  # in a child: the blocks it mapped, kept open


def share(fingerprint: str, x: np.ndarray, y: np.ndarray) -> tuple[SharedArray, SharedArray]:
    """The arrays in shared memory, copied there once per data set (the children map them)."""
    with _shared_lock:
        if fingerprint not in _shared:
            blocks, specs = [], []
            for a in (np.ascontiguousarray(x), np.ascontiguousarray(y)):
                block = shared_memory.SharedMemory(create=True, size=max(1, a.nbytes))
                np.ndarray(a.shape, a.dtype, buffer=block.buf)[...] = a
                blocks.append(block)
                specs.append(SharedArray(block.name, a.shape, a.dtype.str))
            _shared[fingerprint] = (blocks, (specs[0], specs[1]))
        return _shared[fingerprint][1]


def attach(a: SharedArray) -> np.ndarray:
    """In a child: the array, mapped."""
    if a.name not in _attached:  # a spawned child shares its parent's resource tracker: one record of the block
        _attached[a.name] = shared_memory.SharedMemory(name=a.name)
    return np.ndarray(a.shape, np.dtype(a.dtype), buffer=_attached[a.name].buf)


def names() -> list[str]:
    """The blocks this process holds."""
    with _shared_lock:
        return [b.name for blocks, _ in _shared.values() for b in blocks]


def free() -> None:
    """Every block this process put there, removed (its children are gone)."""
    with _shared_lock:
        for blocks, _ in _shared.values():
            for block in blocks:
                block.close()
                block.unlink()
        _shared.clear()
