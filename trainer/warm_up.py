"""What a warm worker does before its first point, while the sweeper still records the sweep and
writes the tickets: MLflow imported and the sweep's store opened in a thread (seconds; not where
its sweeper records its runs, trainer/record/journal.py), the trainer's modules, its data set
(trainer/worker.py), MPI, and on a GPU the CUDA context, cuBLAS and the kernels of the default
config's step and of its test precision compiled (or read from CuPy's cache), by a few steps of a
tiny network."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainer.ranks import lease as leases
from trainer.ranks import parallel
from trainer.record import journal, store

CONF = Path(__file__).resolve().parents[1] / "conf"


def warm_up(nproc: int, before_mpi: Callable[[], None] = lambda: None) -> parallel.World:
    """A warm worker's, before its first point; its world of ``nproc`` ranks (rank 0 records: it
    alone opens the sweep's store). ``before_mpi``: what the worker does first once its modules are
    in (its data set, the references started ahead), before MPI starts (0.5-0.7 s with Open MPI)
    and the GPU's warm-up, which the references then overlap on the cores they leave."""
    if parallel.launcher_rank() == 0 and not hands_off():
        store.open_ahead(os.environ.get(store.AHEAD), then=lambda: say("store open"))
    import trainer.run  # noqa: F401

    before_mpi()
    world = parallel.join_world(nproc)
    lease = leases.from_env(world.local_rank)
    if lease is not None and lease.on_gpu:  # a GPU worker of the local runner
        try:
            _gpu(world.local_rank)
        except Exception as e:  # a point that needs what failed here says why
            print(f"warm-up of the GPU step: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    return world


def hands_off() -> bool:
    """Whether this worker's runs go to journals its sweeper sends (trainer/record/journal.py): its
    rank 0 then never opens the store itself (a point with checkpoints opens it when it starts)."""
    uri = os.environ.get(store.AHEAD, "")
    return os.environ.get(journal.HANDOFF_ENV) == "1" and store.opens_in_background(uri)


def _gpu(local_rank: int) -> None:
    import numpy as np
    from omegaconf import OmegaConf

    from trainer import step
    from trainer.config import TrainerConfig
    from trainer.core import model
    from trainer.core.loop import Schedule, fit
    from trainer.gpu import policy
    from trainer.ranks.backend import select

    xp = select("gpu", local_rank).xp  # the context on the rank's GPU
    values = OmegaConf.load(CONF / "base" / "run.yaml")
    values.pop("defaults", None)
    values.gpu = OmegaConf.load(CONF / "gpu" / "default.yaml")
    cfg = OmegaConf.merge(OmegaConf.structured(TrainerConfig), values)
    layout = model.Layout(D=784, H=16)
    x = xp.asarray(np.arange(64 * 784, dtype=cfg.dtype.value).reshape(64, 784) % 256)
    y = xp.asarray(np.arange(64) % 10)
    params = xp.asarray(model.init_params(layout, 0, cfg.dtype.value, cfg.model.init.value))
    options = policy.step_options(cfg, "gpu")
    fit(step.build(options, xp, layout, params, 32), xp, params, x, y, Schedule(32, 1e-3, 0.0, 1))
    model.correct(layout.views(params), x, y)  # an epoch's end: the first point's took 0.15 s to load these
    xp.cuda.Device().synchronize()


def say(what: str) -> None:
    """Where the worker's start-up stands, in its log: seconds since its process started."""
    from trainer.core.clock import process_start

    print(f"worker: {what} at {time.time() - process_start():.2f} s", file=sys.stderr, flush=True)
