"""Hydra discovers launchers only under the hydra_plugins namespace: this is sweepscale's."""
