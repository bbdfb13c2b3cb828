"""Compose a sweep's points without re-running Hydra's whole composition for each (issue #19).

Hydra's load_sweep_config composes every point from scratch (defaults list, config files, schema
merges): 150-300 ms a point. A point whose overrides differ from an already composed point's only
in plain values (``key=value`` on a config key: no +/++/~, no @package, no config group, nothing
under hydra) composes to that point's config with those overrides applied. So PointComposer
copies the composed config, applies the differing overrides with Hydra's own
ConfigLoaderImpl._apply_overrides_to_config, and redoes what Hydra's _load_configuration_impl and
load_sweep_config set per job from the overrides: hydra.overrides.task, hydra.job.override_dirname
and the resolver cache copied from the master config. Any other point goes to load_sweep_config.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Sequence
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, ValueType
from omegaconf import DictConfig, OmegaConf

# One entry of a point's signature: ("value", key) may take any plain value, ("fixed", line) may not change.
Signature = tuple[tuple[str, str], ...]


class _Template:
    # Not a dataclass: Hydra's plugin scan runs this module outside sys.modules, where @dataclass fails.
    def __init__(self, cfg: DictConfig, overrides: list[Override]) -> None:
        self.cfg = copy.deepcopy(cfg)  # a point's config as Hydra composed it, never handed out
        self.overrides = overrides
        try:  # unpickling a config costs ~1 ms where copy.deepcopy costs ~9: OmegaConf pickles whole
            self._blob: bytes | None = pickle.dumps(self.cfg, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # a value that does not pickle: copy the slow way
            self._blob = None

    def copy(self) -> DictConfig:
        return copy.deepcopy(self.cfg) if self._blob is None else pickle.loads(self._blob)


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


class PointComposer:
    """Each point's config, exactly as ``config_loader.load_sweep_config(master, overrides)``."""

    def __init__(self, config_loader: Any, master_config: DictConfig) -> None:
        self._loader = config_loader
        self._master = master_config
        self._parser = OverridesParser.create()
        self._parsed: dict[str, Override] = {}
        self._groups: dict[str, bool] = {}
        # None: a signature whose points always go to Hydra (a varying key turned out to be a group).
        self._templates: dict[Signature, _Template | None] = {}
        self.fast = 0  # points composed by the fast path, for tests and timing reports

    def compose(self, overrides: Sequence[str]) -> DictConfig:
        """The point's config; a fresh object the caller may change."""
        parsed = [self._parse(o) for o in overrides]
        signature = self._signature(parsed)
        template = self._templates.get(signature)
        if template is not None and self._parents_plain(template, parsed):
            self.fast += 1
            return self._from_template(template, parsed)
        cfg = self._loader.load_sweep_config(self._master, list(overrides))
        if signature not in self._templates:
            self._templates[signature] = self._template(cfg, parsed, signature)
        return cfg

    def _parse(self, line: str) -> Override:
        # Points repeat most of their overrides: parse each distinct string once (ANTLR is slow).
        if line not in self._parsed:
            (self._parsed[line],) = self._parser.parse_overrides([line])
        return self._parsed[line]

    def _is_group(self, key: str) -> bool:
        if key not in self._groups:
            self._groups[key] = bool(self._loader.repository.group_exists(key))
        return self._groups[key]

    def _plain(self, o: Override, parsed: list[Override]) -> bool:
        """Whether Hydra applies o as a plain assignment whose result ignores the value it replaces."""
        key = o.key_or_group
        return (
            o.type == OverrideType.CHANGE
            and o.package is None
            and o.value_type == ValueType.ELEMENT
            and not o.is_hydra_override()
            and key != "hydra"
            and not isinstance(o.value(), (dict, list))  # containers merge into what is there
            and not self._is_group(key)
            # Another override on the same node or one around it would change with the order applied.
            and not any(p is not o and _overlap(key, p.key_or_group) for p in parsed)
        )

    def _signature(self, parsed: list[Override]) -> Signature:
        return tuple(
            ("value", o.key_or_group) if self._plain(o, parsed) else ("fixed", o.input_line or "") for o in parsed
        )

    def _template(self, cfg: DictConfig, parsed: list[Override], signature: Signature) -> _Template | None:
        choices = OmegaConf.select(cfg, "hydra.runtime.choices") or {}
        if any(kind == "value" and key in choices for kind, key in signature):
            return None  # a group of the defaults list after all: its value picks files
        return _Template(cfg, parsed)

    @staticmethod
    def _parents_plain(template: _Template, parsed: list[Override]) -> bool:
        """No differing key goes through an interpolation, which could alias another override's node."""
        for o, t in zip(parsed, template.overrides, strict=True):
            if o is t:
                continue
            node: Any = template.cfg
            for part in o.key_or_group.split(".")[:-1]:
                if not OmegaConf.is_dict(node) or part not in node or OmegaConf.is_interpolation(node, part):
                    return False
                node = node[part]
        return True

    def _from_template(self, template: _Template, parsed: list[Override]) -> DictConfig:
        cfg = template.copy()
        changed = [o for o, t in zip(parsed, template.overrides, strict=True) if o is not t]
        # Hydra's own application: the same typed assignments, the same errors for bad values.
        ConfigLoaderImpl._apply_overrides_to_config(changed, cfg)
        if changed:
            app = [o for o in parsed if not o.is_hydra_override()]
            task = cfg.hydra.overrides.task
            start = len(task) - len(app)  # Hydra appends the point's lines after what the config had
            for i, o in enumerate(app):
                if task[start + i] != o.input_line:
                    task[start + i] = o.input_line
            dirname = cfg.hydra.job.config.override_dirname
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=app, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys
            )
        OmegaConf.copy_cache(from_config=self._master, to_config=cfg)
        return cfg
