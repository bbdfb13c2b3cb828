"""What a run may ask of the machine it is planned on: checked before anything starts."""

from __future__ import annotations

import os

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
