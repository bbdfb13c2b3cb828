"""Training and test data: IDX files (MNIST, Fashion-MNIST), or the embedded digits (a slice of MNIST).

Images come back as float arrays of shape (N, 784), labels as int64 (N,). The pixels are k / 255 in
[0, 1] (scale "unit") or the bytes k themselves (scale "byte", as the course's C++ reads them).
Everything here runs on the host; the trainer decides what goes to the device.
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainer.errors import ConfigError
from trainer.idx import IMAGES_MAGIC, LABELS_MAGIC, declared, read_idx

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

_hashing = threading.Lock()  # one hash of a data set at a time: the others wait for its memo


@dataclass(frozen=True)
class Dataset:
    x_train: np.ndarray  # (N, D) float: k / SCALE_LEVELS[scale], k a byte
    y_train: np.ndarray  # (N,) int64
    x_test: np.ndarray
    y_test: np.ndarray
    source: str  # a folder, or "embedded:mnist-2000"
    # x_train as read, k a byte, and the levels it was divided by: what the fingerprint hashes
    pixel_bytes: tuple[np.ndarray, int] | None = field(default=None, repr=False, compare=False)

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]

    def fingerprint(self) -> str:
        """Hash of the training set the model sees, for the reference cache: its pixels' bytes as read
        (a quarter of the float32 pixels: 0.05 s for MNIST's, where the floats took 0.2 s), the levels
        and dtype they were scaled by and to, or the pixels themselves; its labels. Computed once (a
        warm worker asks at every point of a data set it keeps, a grid's first references at once)."""
        with _hashing:
            if "_fingerprint" not in self.__dict__:  # frozen: the memo goes around __setattr__
                h = hashlib.sha256()
                pixels, levels = (self.x_train, 0) if self.pixel_bytes is None else self.pixel_bytes
                h.update(f"{self.x_train.dtype} / {levels}".encode())
                for a in (pixels, self.y_train):
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


def _folder(data_dir: str | Path) -> Path:
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise ConfigError(
            f"data.dir={folder}: no such folder; give the folder of the IDX files "
            "(e.g. data.dir=../shared/data/mnist) or leave data.dir unset for the embedded digits"
        )
    return folder


def _same_set(img_path: Path, lab_path: Path, n_images: int, n_labels: int, training: bool) -> None:
    if n_images != n_labels:
        raise ConfigError(
            f"{img_path} holds {n_images} images but {lab_path} holds {n_labels} labels; "
            "the two files must come from the same set"
        )
    if n_images == 0 and training:  # a test set may be empty, a training set not
        raise ConfigError(f"{img_path} holds no images; the training set needs at least one")


def _same_width(folder: Path, test_width: int, train_width: int, n_test: int) -> None:
    if n_test and test_width != train_width:  # the network's input width is the training set's
        raise ConfigError(
            f"{_find(folder, FILES['test_images'])}: images of {test_width} pixels, but the training images "
            f"have {train_width}; use test and training files of one data set"
        )


def _within(n_train: int | None, n_test: int | None, have_train: int, have_test: int, source: str) -> None:
    for key, n, have in (("data.n_train", n_train, have_train), ("data.n_test", n_test, have_test)):
        if n is not None and n > have:
            raise ConfigError(f"{key}={n} is larger than the {have} samples in {source}; set {key}<={have} or null")


def _load_pair(folder: Path, images: str, labels: str) -> tuple[np.ndarray, np.ndarray]:
    img_path, lab_path = _find(folder, FILES[images]), _find(folder, FILES[labels])
    x = read_idx(img_path, IMAGES_MAGIC)
    y = read_idx(lab_path, LABELS_MAGIC)
    _same_set(img_path, lab_path, x.shape[0], y.shape[0], images == "train_images")
    if y.size and int(y.max()) >= N_CLASSES:
        raise ConfigError(f"{lab_path}: label {int(y.max())} is outside 0..{N_CLASSES - 1}")
    return x.reshape(x.shape[0], -1 if x.shape[0] else math.prod(x.shape[1:])), y.astype(np.int64)


def load_idx_folder(folder: str | Path) -> Dataset:
    folder = _folder(folder)
    x_train, y_train = _load_pair(folder, "train_images", "train_labels")
    x_test, y_test = _load_pair(folder, "test_images", "test_labels")
    _same_width(folder, x_test.shape[1], x_train.shape[1], len(y_test))
    return Dataset(x_train, y_train, x_test, y_test, source=str(folder.resolve()))


EMBEDDED = Path(__file__).with_name("embedded")  # trainer/embedded/README.md says what it holds
EMBEDDED_SOURCE = "embedded:mnist-2000"


def load_embedded_digits() -> Dataset:
    """The embedded digits: the first 2000 training and 1000 test images of MNIST, shipped in the
    package as IDX files (trainer/embedded/), pixels as bytes."""
    ds = load_idx_folder(EMBEDDED)
    return Dataset(ds.x_train, ds.y_train, ds.x_test, ds.y_test, source=EMBEDDED_SOURCE)


def train_images(data_dir: str | None) -> int:
    """The training images a folder's header declares (the embedded digits' where None)."""
    folder = EMBEDDED if data_dir is None else _folder(data_dir)
    return declared(_find(folder, FILES["train_images"]), IMAGES_MAGIC)[0]


def check(data_dir: str | None, n_train: int | None, n_test: int | None) -> None:
    """What :func:`load` refuses for a folder's files, found from their headers and sizes alone (a
    sweep checks its data so before anything starts; a damaged body is found by the run that loads
    it)."""
    folder, counts, widths = EMBEDDED if data_dir is None else _folder(data_dir), [], []
    for images, labels in (("train_images", "train_labels"), ("test_images", "test_labels")):
        img_path, lab_path = _find(folder, FILES[images]), _find(folder, FILES[labels])
        x, y = declared(img_path, IMAGES_MAGIC), declared(lab_path, LABELS_MAGIC)
        _same_set(img_path, lab_path, x[0], y[0], images == "train_images")
        counts.append(x[0])
        widths.append(math.prod(x[1:]))
    _same_width(folder, widths[1], widths[0], counts[1])
    _within(n_train, n_test, counts[0], counts[1], EMBEDDED_SOURCE if data_dir is None else str(folder.resolve()))


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
    _within(n_train, n_test, len(ds.y_train), len(ds.y_test), ds.source)
    nt = len(ds.y_train) if n_train is None else n_train
    ne = len(ds.y_test) if n_test is None else n_test

    def pixels(a: np.ndarray) -> np.ndarray:
        return a.astype(dtype) / np.asarray(levels, dtype=dtype)

    x_train, x_test = pixels(ds.x_train[:nt]), pixels(ds.x_test[:ne])
    return Dataset(
        x_train, ds.y_train[:nt], x_test, ds.y_test[:ne], source=ds.source, pixel_bytes=(ds.x_train[:nt], levels)
    )
