"""One module per launcher, each a class of the `Runner` protocol (base.py). A launcher config's
``_target_`` names its runner class; `base.make_runner` builds it, so nothing compares names.

Imports ``job`` (what its jobs run), the sweeper's leaves and the trainer; ``plan``, ``track``
and the doors import it.
"""
