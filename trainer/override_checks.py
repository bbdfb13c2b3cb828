"""The command line's overrides, checked before Hydra composes them: a key that moved, refused under
its old spelling with the new one named (``tf32=true`` is ``gpu.gemm=tf32``), and a key given twice
(Hydra keeps the last without a word); after composing, a key added (``+hiden=16``) that the
schema lacks."""

from __future__ import annotations

import difflib
import sys

from omegaconf import OmegaConf

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


def repeated(overrides: list[str]) -> list[tuple[str, str, str]]:
    """(key, first, last) of each key given more than once (``hidden=16 hidden=32``)."""
    first: dict[str, str] = {}
    out = []
    for arg in overrides:
        if arg.startswith("-") or "=" not in arg:
            continue
        key = arg.lstrip("+~").split("=", 1)[0]
        if key in first:
            out.append((key, first[key], arg))
        first.setdefault(key, arg)
    return out


def check_repeated(overrides: list[str]) -> None:
    """A sweep refuses a key given twice (``hidden=16,32 hidden=8``): which grid was meant is not ours
    to guess, and a sweep costs hours."""
    for key, one, other in repeated(overrides):
        raise ConfigError(f"{key} is given twice ({one}, {other}); keep one (a sweep takes {key}=a,b)")


def note_repeated(overrides: list[str]) -> None:
    """A single run keeps Hydra's rule, the last value wins, and says so in a line on stderr."""
    for key, one, other in repeated(overrides):
        print(f"note: {key} is given twice ({one}, {other}): the last, {other}, is used", file=sys.stderr)


def unknown_key(key: str, schema: object) -> str:
    """The message for a key the trainer's schema lacks (``+hiden=16``), with the nearest it has."""
    near = difflib.get_close_matches(key, _keys(schema), n=1)
    hint = f"did you mean {near[0]}?" if near else "the keys: docs/reference.md"
    return f"{key} is not a trainer key: it would change nothing; {hint}"


def extra_keys(cfg: object, schema: object, prefix: str = "") -> list[str]:
    """Keys of ``cfg`` that ``schema`` lacks; anything goes under a dict of free keys (mlflow.tags)."""
    out = []
    for key in cfg:  # type: ignore[attr-defined]
        if key not in list(schema):  # type: ignore[call-overload]  (`in` itself skips MISSING values)
            out.append(f"{prefix}{key}")
            continue
        mine, theirs = cfg._get_node(key), schema._get_node(key)  # type: ignore[attr-defined]
        if OmegaConf.is_dict(mine) and OmegaConf.is_dict(theirs) and OmegaConf.get_type(theirs) is not dict:
            out += extra_keys(mine, theirs, f"{prefix}{key}.")
    return out


def _keys(node: object, prefix: str = "") -> list[str]:
    """Every key path of a config, leaves and groups."""
    out = []
    for key in node:  # type: ignore[attr-defined]
        out.append(f"{prefix}{key}")
        child = node._get_node(key)  # type: ignore[attr-defined]
        if OmegaConf.is_dict(child):
            out += _keys(child, f"{prefix}{key}.")
    return out
