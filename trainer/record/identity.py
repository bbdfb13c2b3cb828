"""A run's identity: the keys of its config that change its result, and the config hash made of
them, the key by which a resumed sweep skips the points it finished (sweeper/track/records.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from omegaconf import OmegaConf

# What a run's result depends on, and only that: the config hash (the key a resumed sweep skips
# finished points by) is made of these keys, each under the name it was first hashed as. A key that
# does not change results (where a run is recorded or its data lives, how a diverged run ends,
# NVTX ranges, saved weights) is not here, so adding, moving or renaming such a key keeps every
# hash; a key moved or renamed here keeps its first name. A new key that changes results joins
# under its own name, hashed only where it differs from the value that gave the old results.
IDENTITY: dict[str, str] = {
    name: name
    for name in (
        "hidden", "batch_size", "lr", "epochs", "nproc", "reg", "dtype", "device", "seed",
        "model.init",
        "data.dir", "data.n_train", "data.n_test", "data.shuffle", "data.on_device", "data.scale",
        "gpu.step", "gpu.comm", "gpu.gemm", "gpu.overlap", "gpu.nccl_window",
        "check.reference", "check.steps",
        "perf.peak_tflops", "perf.repeats",
        "fault.rank", "fault.iteration", "fault.kind", "perf.timing",
    )
}  # fmt: skip
# Keys that joined later: hashed only where they differ from the value every earlier result had.
SINCE: dict[str, str] = {"perf.timing": "shared"}
# Keys once hashed that change no result any more: hashed at the value every earlier result had, so
# that earlier sweeps still resume. perf.repeats: since the timing protocol (trainer/core/timing.py)
# its repeats cut the timed batches, with no run of their own.
FROZEN: dict[str, object] = {"perf.repeats": 1}


def identity(cfg: Any, ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The resolved values of IDENTITY's keys (hash name -> value), but for the groups in ``ignore``."""
    values = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    out = {}
    for name, path in IDENTITY.items():
        if path.split(".")[0] in ignore:
            continue
        node: Any = values
        for part in path.split("."):
            node = node[part]
        if path in FROZEN:
            out[name] = FROZEN[path]
        elif SINCE.get(path, object()) != node:
            out[name] = node
    return out


def config_hash(cfg: Any, ignore: tuple[str, ...] = ()) -> str:
    """Short hash of everything that determines a run's result (IDENTITY): the resume key of sweeps."""
    return hashlib.sha256(json.dumps(identity(cfg, ignore), sort_keys=True).encode()).hexdigest()[:12]
