"""IDX loading: real digits written as IDX files, and every bad file named in its error."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import write_idx_set
from trainer import data, idx
from trainer.errors import ConfigError


@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip_scaled_to_unit_interval(tmp_path: Path, gz: bool):
    folder = write_idx_set(tmp_path, n_train=50, n_test=20, gz=gz)
    ds = data.load(str(folder), None, None, "float64")
    ref = data.load_embedded_digits()
    assert ds.x_train.shape == (50, 784) and ds.x_test.shape == (20, 784)
    assert ds.x_train.dtype == np.float64 and ds.x_train.min() >= 0 and ds.x_train.max() <= 1
    np.testing.assert_array_equal(np.round(ds.x_train * 255).astype(np.uint8), ref.x_train[:50])
    np.testing.assert_array_equal(ds.y_test, ref.y_test[:20])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pixels_are_integer_levels(idx_dir: Path, dtype: str):
    """What the fused step's bf16x3 and two-product tf32x3 GEMMs rely on (trainer/gpu/fused_step.py, x_levels):
    every pixel is k / PIXEL_LEVELS, and k = rint(x PIXEL_LEVELS) gives the file's bytes back."""
    raw = idx.read_idx(data._find(idx_dir, data.FILES["train_images"]), idx.IMAGES_MAGIC).reshape(-1, 784)
    ds = data.load(str(idx_dir), None, None, dtype)
    k = np.rint(ds.x_train * np.asarray(data.PIXEL_LEVELS, dtype=dtype))
    np.testing.assert_array_equal(k, raw)
    np.testing.assert_array_equal((k / np.asarray(data.PIXEL_LEVELS, dtype=dtype)).astype(dtype), ds.x_train)
    assert k.max() <= 2**8  # exact in BF16 and TF32 (trainer/options.py BF16_EXACT_INTEGERS, TF32_EXACT_INTEGERS)


def test_first_n_samples(idx_dir: Path):
    ds = data.load(str(idx_dir), 13, 0, "float32")
    assert len(ds.y_train) == 13 and len(ds.y_test) == 0 and ds.x_train.dtype == np.float32


def test_embedded_digits_are_the_first_mnist_digits():
    ds = data.load_embedded_digits()
    assert ds.x_train.shape == (2000, 784) and ds.x_test.shape == (1000, 784) and ds.x_train.dtype == np.uint8
    assert set(np.unique(ds.y_train)) == set(range(10)) and set(np.unique(ds.y_test)) == set(range(10))
    assert ds.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]  # MNIST's first training labels
    assert ds.y_test[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]  # and its first test labels
    full = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
    if full.is_dir():  # byte for byte the original's first images (the developers' machines have it)
        whole = data.load_idx_folder(full)
        np.testing.assert_array_equal(ds.x_train, whole.x_train[:2000])
        np.testing.assert_array_equal(ds.x_test, whole.x_test[:1000])


def test_missing_folder(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"data.dir=.*nope: no such folder; give the folder of the IDX files"):
        data.load(str(tmp_path / "nope"), None, None, "float32")


def test_missing_file(idx_dir: Path):
    (idx_dir / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(ConfigError, match=r"no file 't10k-labels-idx1-ubyte' or 't10k-labels-idx1-ubyte.gz' there"):
        data.load(str(idx_dir), None, None, "float32")


def test_wrong_magic(idx_dir: Path):
    labels = idx_dir / "train-labels-idx1-ubyte.gz"
    images = idx_dir / "train-images-idx3-ubyte.gz"
    labels.write_bytes(images.read_bytes())  # images where labels belong
    with pytest.raises(
        ConfigError, match=r"train-labels-idx1-ubyte.gz: wrong IDX magic number 0x00000803, expected 0x00000801"
    ):
        data.load(str(idx_dir), None, None, "float32")


def test_truncated_file(idx_dir: Path):
    path = idx_dir / "train-images-idx3-ubyte.gz"
    raw = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(raw[:-100]))
    with pytest.raises(
        ConfigError, match=r"train-images-idx3-ubyte.gz: truncated or padded: header says \(60, 28, 28\)"
    ):
        data.load(str(idx_dir), None, None, "float32")


def test_corrupt_gzip(idx_dir: Path):
    path = idx_dir / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ConfigError, match=r"train-images-idx3-ubyte.gz: cannot be read"):
        data.load(str(idx_dir), None, None, "float32")


def test_count_mismatch(tmp_path: Path):
    folder = write_idx_set(tmp_path, n_train=40, n_test=10)
    idx.write_idx(folder / "train-labels-idx1-ubyte.gz", np.zeros(39, dtype=np.uint8))
    with pytest.raises(ConfigError, match=r"holds 40 images but .*train-labels-idx1-ubyte.gz holds 39 labels"):
        data.load(str(folder), None, None, "float32")


def test_n_train_larger_than_data(idx_dir: Path):
    with pytest.raises(
        ConfigError, match=r"data.n_train=61 is larger than the 60 samples in .*; set data.n_train<=60 or null"
    ):
        data.load(str(idx_dir), 61, None, "float32")


def test_full_mnist_header_is_read_when_present():
    """Not required by the suite: checks the shared copy's headers when this machine has it."""
    folder = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
    if not folder.is_dir():
        pytest.skip(f"full MNIST not at {folder} (only the developers' machines have it)")
    x = idx.read_idx(folder / "t10k-labels-idx1-ubyte.gz", idx.LABELS_MAGIC)
    assert x.shape == (10000,)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_byte_scale_gives_the_file_bytes(idx_dir: Path, dtype: str):
    """data.scale=byte: the pixels as the course's read_mnist gives them, the bytes 0..255 unscaled;
    unit is the same bytes / 255. Both are k / pixel_levels(scale) with k a byte, which the fused
    step's x_levels relies on (trainer/gpu/fused_step.py: rint(x levels) is k, exact in BF16 and TF32)."""
    raw = idx.read_idx(data._find(idx_dir, data.FILES["train_images"]), idx.IMAGES_MAGIC).reshape(-1, 784)
    byte = data.load(str(idx_dir), None, None, dtype, scale="byte")
    unit = data.load(str(idx_dir), None, None, dtype, scale="unit")
    assert byte.x_train.dtype == np.dtype(dtype) and byte.x_train.max() == raw.max() > 1
    np.testing.assert_array_equal(byte.x_train, raw)
    np.testing.assert_array_equal(unit.x_train, (raw.astype(dtype) / np.asarray(255, dtype=dtype)))
    np.testing.assert_array_equal(byte.y_train, unit.y_train)
    assert data.pixel_levels("byte") == 1 and data.pixel_levels("unit") == data.PIXEL_LEVELS == 255
    for ds, scale in ((byte, "byte"), (unit, "unit")):
        k = np.rint(ds.x_train * np.asarray(data.pixel_levels(scale), dtype=dtype))
        np.testing.assert_array_equal(k, raw)
    assert byte.fingerprint() != unit.fingerprint()  # the reference cache tells them apart


def test_default_scale_is_unit(idx_dir: Path):
    ds, unit = data.load(str(idx_dir), None, None, "float32"), data.load(str(idx_dir), None, None, "float32", "unit")
    assert ds.x_train.max() <= 1 and np.array_equal(ds.x_train, unit.x_train)


def test_unknown_scale_names_the_key(idx_dir: Path):
    with pytest.raises(ConfigError, match=r"data.scale=minmax: expected one of unit, byte"):
        data.load(str(idx_dir), None, None, "float32", scale="minmax")


def test_a_header_whose_product_wraps_in_int64_is_refused(tmp_path: Path):
    # 2^22 x 2^21 x 2^21 = 2^64: zero in int64 arithmetic, so a file of 16 header bytes "fit" it.
    path = tmp_path / "train-images-idx3-ubyte"
    dims = (1 << 22, 1 << 21, 1 << 21)
    path.write_bytes(idx.IMAGES_MAGIC.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims))
    with pytest.raises(
        ConfigError, match=r"the header declares \(4194304, 2097152, 2097152\), 18446744073709551616 bytes"
    ):
        idx.read_idx(path, idx.IMAGES_MAGIC)


def test_a_gzip_bomb_is_not_inflated_past_its_header(tmp_path: Path):
    """A small .gz whose header declares 10 images but which inflates to 200 MB of zeros: refused
    as padded after reading the 10 images and one byte more, never inflated whole."""
    import resource
    import zlib

    path = tmp_path / "train-images-idx3-ubyte.gz"
    header = idx.IMAGES_MAGIC.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (10, 28, 28))
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    chunks = [packer.compress(header)] + [packer.compress(bytes(1 << 20)) for _ in range(200)] + [packer.flush()]
    path.write_bytes(b"".join(chunks))
    assert path.stat().st_size < 1 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(
        ConfigError, match=r"truncated or padded: header says \(10, 28, 28\) \(7856 bytes\) but the file has more"
    ):
        idx.read_idx(path, idx.IMAGES_MAGIC)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 50  # the whole stream would take 200 MiB


def test_an_idx_training_set_without_images_is_named(tmp_path: Path):
    folder = write_idx_set(tmp_path, n_train=0, n_test=5)
    with pytest.raises(ConfigError, match=r"train-images-idx3-ubyte.gz holds no images; the training set needs"):
        data.load(str(folder), None, None, "float32")


def test_test_images_of_another_size_are_named(tmp_path: Path):
    """The network's input width is the training images': a test set of other images is refused."""
    folder = write_idx_set(tmp_path, n_train=5, n_test=5)
    idx.write_idx(folder / f"{data.FILES['test_images']}.gz", np.zeros((5, 10, 10), np.uint8))
    with pytest.raises(ConfigError, match=r"t10k-images-idx3-ubyte.gz: images of 100 pixels, but the training"):
        data.load_idx_folder(folder)


def _truncate(folder: Path) -> None:
    path = folder / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:-100]))


def _cut_gzip(folder: Path) -> None:
    path = folder / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:200])


def _pad_raw(folder: Path) -> None:
    path = folder / "train-labels-idx1-ubyte.gz"
    raw = gzip.decompress(path.read_bytes())
    path.unlink()
    (folder / "train-labels-idx1-ubyte").write_bytes(raw + b"\0")


def _swap_magic(folder: Path) -> None:
    (folder / "train-labels-idx1-ubyte.gz").write_bytes((folder / "train-images-idx3-ubyte.gz").read_bytes())


def _fewer_labels(folder: Path) -> None:
    idx.write_idx(folder / "train-labels-idx1-ubyte.gz", np.zeros(59, dtype=np.uint8))


def _narrow_test_images(folder: Path) -> None:
    idx.write_idx(folder / "t10k-images-idx3-ubyte.gz", np.zeros((30, 10, 10), np.uint8))


@pytest.mark.parametrize(
    ("damage", "n_train", "message"),
    [
        (lambda f: (f / "t10k-labels-idx1-ubyte.gz").unlink(), None, r"no file 't10k-labels-idx1-ubyte' or"),
        (_swap_magic, None, r"train-labels-idx1-ubyte.gz: wrong IDX magic number 0x00000803, expected 0x00000801"),
        (_truncate, None, r"train-images-idx3-ubyte.gz: truncated or padded: header says \(60, 28, 28\)"),
        (_cut_gzip, None, r"train-images-idx3-ubyte.gz: truncated or padded"),
        (_pad_raw, None, r"train-labels-idx1-ubyte: truncated or padded: header says \(60,\) \(68 bytes\)"),
        (_fewer_labels, None, r"holds 60 images but .*train-labels-idx1-ubyte.gz holds 59 labels"),
        (_narrow_test_images, None, r"t10k-images-idx3-ubyte.gz: images of 100 pixels, but the training"),
        (lambda f: None, 61, r"data.n_train=61 is larger than the 60 samples in .*; set data.n_train<=60 or null"),
    ],
)
def test_the_header_check_finds_what_loading_would(idx_dir: Path, damage, n_train, message):
    """A sweep checks its data by headers and sizes (data.check), never inflating an image body."""
    damage(idx_dir)
    with pytest.raises(ConfigError, match=message):
        data.check(str(idx_dir), n_train, None)


def test_the_header_check_reads_no_body(idx_dir: Path):
    """A body the headers cannot vouch for (a label out of range) is the loading run's to find."""
    idx.write_idx(idx_dir / "train-labels-idx1-ubyte.gz", np.full(60, 200, dtype=np.uint8))
    data.check(str(idx_dir), None, None)
    with pytest.raises(ConfigError, match=r"label 200 is outside 0..9"):
        data.load(str(idx_dir), None, None, "float32")


def test_the_embedded_digits_are_checked_by_their_headers():
    data.check(None, 2000, 1000)
    with pytest.raises(ConfigError, match=r"data.n_train=2001 is larger than the 2000 samples in embedded:mnist-2000"):
        data.check(None, 2001, None)


def _under_memory_limit(gib: float):
    """For a child process: at most ``gib`` GiB of address space, as `ulimit -v` sets it."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (int(gib * 2**30), int(gib * 2**30)))

    return limit


def test_a_header_declaring_more_than_memory_holds_is_refused_before_inflating(tmp_path: Path):
    """A small .gz declaring 600,000 images (470 MB): under a 3 GiB limit the run could not hold
    them as float64 pixels; refused from the header, in a moment, nothing inflated (#33)."""
    import subprocess
    import sys
    import time
    import zlib

    folder = write_idx_set(tmp_path / "set", n_train=5, n_test=5)
    path = folder / "train-images-idx3-ubyte.gz"
    header = idx.IMAGES_MAGIC.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (600_000, 28, 28))
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(784 * 1000)  # the body in chunks: the test itself never holds 470 MB
    chunks = [packer.compress(header)] + [packer.compress(zeros) for _ in range(600)] + [packer.flush()]
    path.write_bytes(b"".join(chunks))
    code = f"from trainer import data; data.load({str(folder)!r}, None, None, 'float32')"
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, preexec_fn=_under_memory_limit(3)
    )
    assert done.returncode != 0 and time.perf_counter() - t0 < 30
    assert "the header declares (600000, 28, 28), 470400000 bytes, more than an IDX file here may hold" in done.stderr


def test_hidden_is_checked_against_the_memory_the_process_may_use(tmp_path: Path):
    """hidden=1500000 under `ulimit -v` 4 GiB: refused before any rank, not a MemoryError mid-run (#33)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "trainer", "hidden=1500000", "device=cpu"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_under_memory_limit(4),
    )
    assert done.returncode == 2, done.stderr
    assert "Error: hidden=1500000: the weights and their copies would take" in done.stderr
    assert "GiB of memory this process may use; lower hidden" in done.stderr and "Traceback" not in done.stderr


def test_the_fingerprint_hashes_the_training_set_as_read_and_tells_apart_what_differs(idx_dir: Path, tmp_path: Path):
    """The reference cache's key of a data set: the pixels' bytes as read (not the floats made of
    them) with the dtype and levels, and the labels. One pixel, one label, the samples taken or the
    dtype changed: another fingerprint; the same files loaded again: the same."""
    fp = data.load(str(idx_dir), None, None, "float32").fingerprint()
    assert data.load(str(idx_dir), None, None, "float32").fingerprint() == fp
    assert data.load(str(idx_dir), 50, None, "float32").fingerprint() != fp
    assert data.load(str(idx_dir), None, None, "float64").fingerprint() != fp
    ds = data.load_embedded_digits()
    for changed in ("pixel", "label"):
        x, y = ds.x_train[:60].copy(), ds.y_train[:60].copy()
        if changed == "pixel":
            x[7, 300] ^= 1
        else:
            y[7] = (y[7] + 1) % data.N_CLASSES
        folder = tmp_path / changed
        folder.mkdir()
        for name in ("test_images", "test_labels"):
            (folder / f"{data.FILES[name]}.gz").write_bytes((idx_dir / f"{data.FILES[name]}.gz").read_bytes())
        idx.write_idx(folder / f"{data.FILES['train_images']}.gz", x.reshape(-1, data.SIDE, data.SIDE))
        idx.write_idx(folder / f"{data.FILES['train_labels']}.gz", y)
        assert data.load(str(folder), None, None, "float32").fingerprint() != fp, changed
