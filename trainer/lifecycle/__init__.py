"""How a run survives and ends: what each epoch's end does (``epoch_end``: checkpoint, record,
divergence, the time limit), the CPU-vs-GPU check (``check``) and its reference jobs beside the
run (``reference_jobs``), requeue at a time limit (``requeue``), the faults a drill asks for
(``faults``), the warm queue's file protocol that the sweeper shares (``queue_files``, stdlib
only), and the launch under mpiexec (``launch``).

Imports the contracts and every wing below it: ``core``, ``gpu``, ``ranks``, ``record``.
"""
