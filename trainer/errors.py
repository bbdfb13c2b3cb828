"""The trainer's error for bad user input; imports nothing, so data, backend and ranks need no Hydra."""


class ConfigError(ValueError):
    """Bad user input, reported before any training; the message names the key and the fix."""
