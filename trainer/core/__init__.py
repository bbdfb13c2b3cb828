"""How a run is computed: the model (``model``), the generic step and its gradient buffer
(``generic_step``), mini-batch SGD (``loop``: ``fit`` takes a built step), the sequential float64
reference (``reference``), FLOPs and bytes per step (``flops``), the phase clock (``clock``).

Arrays in, arrays out: no MPI, MLflow, Hydra, files or signals beyond the reference's cache file.
Imports the contracts (``trainer.options``, ``trainer.errors``) and nothing else of the trainer.
"""
