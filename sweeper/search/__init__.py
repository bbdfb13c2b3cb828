"""The asynchronous search (``hydra/sweeper=search``): a source of points the sweep asks as its
workers free. ``options`` is its typed schema and checks, ``space`` the parsed space (Hydra's
override grammar), ``study`` the Optuna study that asks, tells and prunes, ``flow`` what the sweep
calls: the space's corners for the checks, the first trials, a trial per freed worker, the end.

Imports ``track`` (the records and the watch it feeds), ``plan``, the sweeper's leaves and the
trainer's contracts; only the doors import it.
"""
