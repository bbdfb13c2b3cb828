"""Training and test data: IDX files (MNIST, Fashion-MNIST), or the embedded digits (a slice of MNIST).

Images come back as float arrays of shape (N, 784), labels as int64 (N,). The pixels are k / 255 in
[0, 1] (scale "unit") or the bytes k themselves (scale "byte", as the course's C++ reads them).
Everything here runs on the host; the trainer decides what goes to the device.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.errors import ConfigError

# IDX magic numbers: 0x00 0x00, type 0x08 (unsigned byte), number of dimensions.
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
SIDE = 28
N_CLASSES = 10
# Pixels are bytes: load() gives k / PIXEL_LEVELS, k an integer in 0..255. The GPU's float32-accurate
# tensor-core GEMMs rely on it (trainer/gpu/fused_step.py): k is exact in TF32, k / 255 is not.
PIXEL_LEVELS = 255
# data.scale -> the x_levels of the fused step (trainer/gpu/fused_step.py): every pixel is k / levels, k a byte.
# unit: k / 255 in [0, 1]; byte: k itself (levels 1), the course's read_mnist: (nn_real)temp, unscaled.
SCALE_LEVELS = {"unit": PIXEL_LEVELS, "byte": 1}

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


@dataclass(frozen=True)
class Dataset:
    x_train: np.ndarray  # (N, D) float: k / SCALE_LEVELS[scale], k a byte
    y_train: np.ndarray  # (N,) int64
    x_test: np.ndarray
    y_test: np.ndarray
    source: str  # a folder, or "embedded:mnist-2000"

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]

    def fingerprint(self) -> str:
        """Hash of the bytes the model sees, for the reference cache; computed once (a warm worker
        asks at every point of a data set it keeps)."""
        if "_fingerprint" not in self.__dict__:  # frozen: the memo goes around __setattr__
            h = hashlib.sha256()
            for a in (self.x_train, self.y_train):
                h.update(str(a.shape).encode() + str(a.dtype).encode())
                h.update(np.ascontiguousarray(a).data)
            self.__dict__["_fingerprint"] = h.hexdigest()[:16]
        return self.__dict__["_fingerprint"]


def _find(folder: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    raise ConfigError(
        f"data.dir={folder}: no file '{stem}' or '{stem}.gz' there; point data.dir at a folder "
        f"holding the four MNIST-format IDX files ({', '.join(FILES.values())})"
    )


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
            body = math.prod(dims)  # Python integers: no overflow, unlike a product in int64
            if body > MAX_IDX_BYTES:
                raise ConfigError(
                    f"{path}: the header declares {dims}, {body} bytes, more than an IDX file here may "
                    f"hold ({MAX_IDX_BYTES}); replace it with an intact IDX file"
                )
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


def _load_pair(folder: Path, images: str, labels: str) -> tuple[np.ndarray, np.ndarray]:
    img_path, lab_path = _find(folder, FILES[images]), _find(folder, FILES[labels])
    x = read_idx(img_path, IMAGES_MAGIC)
    y = read_idx(lab_path, LABELS_MAGIC)
    if x.shape[0] != y.shape[0]:
        raise ConfigError(
            f"{img_path} holds {x.shape[0]} images but {lab_path} holds {y.shape[0]} labels; "
            "the two files must come from the same set"
        )
    if x.shape[0] == 0 and images == "train_images":  # a test set may be empty, a training set not
        raise ConfigError(f"{img_path} holds no images; the training set needs at least one")
    if y.size and int(y.max()) >= N_CLASSES:
        raise ConfigError(f"{lab_path}: label {int(y.max())} is outside 0..{N_CLASSES - 1}")
    return x.reshape(x.shape[0], -1 if x.shape[0] else math.prod(x.shape[1:])), y.astype(np.int64)


def load_idx_folder(folder: str | Path) -> Dataset:
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ConfigError(
            f"data.dir={folder}: no such folder; give the folder of the IDX files "
            "(e.g. data.dir=../shared/data/mnist) or leave data.dir unset for the embedded digits"
        )
    x_train, y_train = _load_pair(folder, "train_images", "train_labels")
    x_test, y_test = _load_pair(folder, "test_images", "test_labels")
    if len(y_test) and x_test.shape[1] != x_train.shape[1]:  # the network's input width is the training set's
        raise ConfigError(
            f"{_find(folder, FILES['test_images'])}: images of {x_test.shape[1]} pixels, but the training images "
            f"have {x_train.shape[1]}; use test and training files of one data set"
        )
    return Dataset(x_train, y_train, x_test, y_test, source=str(folder.resolve()))


EMBEDDED = Path(__file__).with_name("embedded")  # trainer/embedded/README.md says what it holds


def load_embedded_digits() -> Dataset:
    """The embedded digits: the first 2000 training and 1000 test images of MNIST, shipped in the
    package as IDX files (trainer/embedded/), pixels as bytes."""
    ds = load_idx_folder(EMBEDDED)
    return Dataset(ds.x_train, ds.y_train, ds.x_test, ds.y_test, source="embedded:mnist-2000")


def pixel_levels(scale: str) -> int:
    """The x_levels of data.scale: load() gives every pixel as k / levels, k an integer in 0..255."""
    if scale not in SCALE_LEVELS:
        raise ConfigError(f"data.scale={scale}: expected one of {', '.join(SCALE_LEVELS)}")
    return SCALE_LEVELS[scale]


def load(data_dir: str | None, n_train: int | None, n_test: int | None, dtype: str, scale: str = "unit") -> Dataset:
    """Load, take the first n samples, give the pixels as k / pixel_levels(scale) in the run's dtype:
    unit, in [0, 1]; byte, the bytes 0..255 unscaled."""
    levels = pixel_levels(scale)
    ds = load_embedded_digits() if data_dir is None else load_idx_folder(data_dir)
    for key, n, have in (("data.n_train", n_train, len(ds.y_train)), ("data.n_test", n_test, len(ds.y_test))):
        if n is not None and n > have:
            raise ConfigError(f"{key}={n} is larger than the {have} samples in {ds.source}; set {key}<={have} or null")
    nt = len(ds.y_train) if n_train is None else n_train
    ne = len(ds.y_test) if n_test is None else n_test

    def pixels(a: np.ndarray) -> np.ndarray:
        return a.astype(dtype) / np.asarray(levels, dtype=dtype)

    return Dataset(pixels(ds.x_train[:nt]), ds.y_train[:nt], pixels(ds.x_test[:ne]), ds.y_test[:ne], source=ds.source)
