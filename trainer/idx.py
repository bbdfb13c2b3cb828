"""The IDX file format of MNIST (and Fashion-MNIST): a header (magic number, then each dimension as
a big-endian 32-bit integer) and the unsigned bytes, raw or gzip-compressed. The header is read and
checked first; nothing is read or inflated past the size it declares."""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from trainer import limits
from trainer.errors import ConfigError

# IDX magic numbers: 0x00 0x00, type 0x08 (unsigned byte), number of dimensions.
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
# The most an IDX file may declare: 4 GiB, over 50 times full MNIST's training images. A header
# beyond it is damage or a decompression bomb, refused before anything is inflated.
MAX_IDX_BYTES = 1 << 32


def read_idx(path: Path, magic: int) -> np.ndarray:
    """Read one IDX file (raw or gzip), its header checked first: nothing is read or inflated past
    the size the header declares (plus one byte, to find padding)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            dims, header = _idx_header(path, f.read(4), f, magic)
            body = _within_memory(path, dims)
            raw = f.read(body + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise ConfigError(f"{path}: cannot be read ({e}); replace it with an intact IDX file") from e
    if len(raw) != body:
        found = f"{header + len(raw)} bytes" if len(raw) <= body else "more"
        raise ConfigError(
            f"{path}: truncated or padded: header says {dims} ({header + body} bytes) but the file has "
            f"{found}; replace it with an intact IDX file"
        )
    return np.frombuffer(raw, dtype=np.uint8).reshape(dims)


def _within_memory(path: Path, dims: tuple[int, ...]) -> int:
    """The body's bytes the header declares, refused above MAX_IDX_BYTES or above what the memory this
    process may use holds as float64 pixels (8 bytes each): before a byte of it is inflated."""
    body = math.prod(dims)  # Python integers: no overflow, unlike a product in int64
    most = min(MAX_IDX_BYTES, limits.machine_memory() // 8)
    if body > most:
        raise ConfigError(
            f"{path}: the header declares {dims}, {body} bytes, more than an IDX file here may hold "
            f"({most}: 4 GiB at most, and the memory this process may use must hold it as float64 pixels); "
            "replace it with an intact IDX file"
        )
    return body


def _idx_header(path: Path, start: bytes, f: Any, magic: int) -> tuple[tuple[int, ...], int]:
    """The dimensions an IDX header declares, and the header's length."""
    if len(start) < 4:
        raise ConfigError(f"{path}: truncated, only {len(start)} bytes; replace it with an intact IDX file")
    found = int.from_bytes(start, "big")
    if found != magic:
        raise ConfigError(
            f"{path}: wrong IDX magic number 0x{found:08x}, expected 0x{magic:08x} "
            f"({'images' if magic == IMAGES_MAGIC else 'labels'}); is this the right file?"
        )
    ndim = magic & 0xFF
    raw = f.read(4 * ndim)
    if len(raw) < 4 * ndim:
        raise ConfigError(f"{path}: truncated header; replace it with an intact IDX file")
    return tuple(int.from_bytes(raw[4 * i : 4 * i + 4], "big") for i in range(ndim)), 4 + 4 * ndim


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (gzip if the name ends in .gz): the inverse of read_idx."""
    a = np.ascontiguousarray(array, dtype=np.uint8)
    header = (0x0800 | a.ndim).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in a.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + a.tobytes())


def declared(path: Path, magic: int) -> tuple[int, ...]:
    """The dimensions ``path``'s header declares, checked against the file's size without reading its
    body: a raw file's length, or a gzip file's own record of its inflated size (its last 4 bytes)."""
    gz = path.suffix == ".gz"
    try:
        with (gzip.open if gz else open)(path, "rb") as f:
            dims, header = _idx_header(path, f.read(4), f, magic)
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if gz and size >= 4:
                f.seek(-4, 2)
                size = int.from_bytes(f.read(4), "little")  # ISIZE: the inflated size mod 2**32
    except (OSError, EOFError, zlib.error) as e:
        raise ConfigError(f"{path}: cannot be read ({e}); replace it with an intact IDX file") from e
    whole = header + _within_memory(path, dims)
    if size != (whole % 2**32 if gz else whole):
        raise ConfigError(
            f"{path}: truncated or padded: header says {dims} ({whole} bytes) but the file has "
            f"{size if not gz else 'another size'}; replace it with an intact IDX file"
        )
    return dims
