"""The trainer's keys that moved, refused under their old spelling with the new one named, before
anything starts (``tf32=true`` is ``gpu.gemm=tf32``)."""

from __future__ import annotations

from trainer.errors import ConfigError

# Keys that moved into the gpu group: old spelling -> new key.
OLD_KEYS = {k: f"gpu.{k}" for k in ("step", "comm", "overlap", "nccl_window", "profile")}
OLD_KEYS.update(tf32="gpu.gemm", fp32_gemm="gpu.gemm")


def check_old_keys(overrides: list[str]) -> None:
    """Refuse the old spellings of the gpu group's keys (``tf32=true``, ``step=fused``, ...) before
    anything starts. Raises ConfigError naming the new key, e.g. "tf32 is now gpu.gemm=tf32"."""
    for arg in overrides:
        if arg.startswith("-"):  # --multirun, -m, --dry-run, ...
            continue
        key, _, value = arg.lstrip("+~").partition("=")
        if key not in OLD_KEYS:
            continue
        new = OLD_KEYS[key]
        if key == "tf32":
            if value.lower() in ("true", "1", "yes", "on"):
                raise ConfigError("tf32 is now gpu.gemm=tf32 (one TF32 product); set gpu.gemm=tf32 or gpu=tf32")
            raise ConfigError(f"tf32 is now gpu.gemm: tf32={value} is gpu.gemm=bf16x3 (the default), tf32x3 or sgemm")
        raise ConfigError(f"{key} is now {new}" + (f"={value}; set {new}={value}" if value else f"; set {new}"))
