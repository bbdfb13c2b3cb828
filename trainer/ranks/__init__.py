"""Processes and ranks: the MPI world (``parallel``), the step's all-reduce over it (``allreduce``), the array backend
and its GPU (``backend``), the GPUs or cores that warm workers share (``lease``), what else ran
during a run's timed batches (``contention``), how a process ends and whether one is alive
(``processes``), and SIGTERM (``sigterm``: the run ends KILLED, never halfway through a write).

Imports the contracts, ``trainer.core`` and ``trainer.gpu``.
"""
