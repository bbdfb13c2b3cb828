"""Write trainer/embedded/: the first 2000 training and 1000 test images of MNIST, byte for byte,
as the four IDX files the trainer reads when data.dir is null (the default sweep's data).

    python scripts/embed_mnist.py ../shared/data/mnist

The gzip headers carry no time stamp, so the files come out the same on every run.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer import data, idx

N = {"train": 2000, "t10k": 1000}


def main(source: str) -> None:
    out = Path(__file__).resolve().parents[1] / "trainer" / "embedded"
    out.mkdir(exist_ok=True)
    for key, stem in data.FILES.items():
        magic = idx.IMAGES_MAGIC if "images" in key else idx.LABELS_MAGIC
        array = idx.read_idx(data._find(Path(source), stem), magic)[: N[stem.split("-")[0]]]
        a = np.ascontiguousarray(array, dtype=np.uint8)
        header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in a.shape)
        with open(out / f"{stem}.gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(header + a.tobytes())
        print(out / f"{stem}.gz", a.shape)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/mnist")
