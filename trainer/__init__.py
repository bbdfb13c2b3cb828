"""sweepscale's trainer: a data-parallel two-layer MLP on MPI ranks, checked and recorded.

At the top, the doors and the contracts. Doors: ``run`` (one run: ``python -m trainer``,
``__main__``), ``worker`` (a warm worker serving a queue of points: ``python -m trainer.worker``,
its GPU warmed by ``warm_up``, its points' configs, data sets and references in
``worker_points``) and ``step`` (which step a run trains with). Contracts, which every wing may
import: ``config`` (the typed config, its checks in ``limits`` and ``override_checks``, Hydra's
run mode read from the command line in ``hydra_mode``),
``options`` (how the step runs), ``data`` (the data set, its file format in ``idx``), ``metrics``
(the names a run records) and ``errors``.

The wings, lowest first; a wing imports the contracts, itself and the wings below it, never one
above (tests/test_layout.py checks it):

- ``core/``: how it is computed: the model, the generic step, the loop, the sequential reference,
  FLOPs and bytes, the phase clock. Arrays in, arrays out.
- ``gpu/``: the kernel wing: the fused step, its GEMMs and operands, NCCL, the GPU policy.
- ``ranks/``: processes and ranks: how they start, sum, share the devices, hear SIGTERM and end.
- ``record/``: what a run leaves behind: the MLflow store and run, the journal, checkpoints,
  provenance, the URI check, the console's lines.
- ``lifecycle/``: how a run survives and ends: the CPU check's reference jobs, requeue, the warm
  queue's file protocol, the launch under mpiexec.
"""
