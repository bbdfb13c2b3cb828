"""What a run leaves behind: the MLflow store (``store``) and run (``tracking``), the journal that
keeps writes while a tracking server is away (``journal``), what a run records at its start, each
epoch and its end (``run_record``), checkpoints (``checkpoint``), the code's provenance
(``provenance``), the config's hash (``identity``), the tracking URI's check (``uri_check``) and
the console's lines (``console``).

Imports the contracts, ``trainer.core``, ``trainer.gpu`` and ``trainer.ranks``.
"""
