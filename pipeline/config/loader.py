"""Reading YAML within bounds: a config file (or a storage-options file) is read with
``yaml.SafeLoader`` (no code runs), refused above a size, and stopped while composing at a
number of aliases and nodes, before an alias bomb expands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .messages import ConfigError

#: bounds on a config file: its size, YAML aliases (an alias bomb expands exponentially
#: when the mapping is walked) and nodes (scalars, lists and mappings)
MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_ALIASES = 100
MAX_YAML_NODES = 100_000


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (no code runs) that stops at MAX_YAML_ALIASES aliases and
    MAX_YAML_NODES nodes while composing, before anything is expanded."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = self._nodes = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _YamlBoundError(f"more than {MAX_YAML_ALIASES} YAML aliases (*name)")
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            raise _YamlBoundError(f"more than {MAX_YAML_NODES} YAML nodes")
        return super().compose_node(parent, index)


class _YamlBoundError(Exception):
    pass


def safe_yaml(text: str) -> Any:
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_config_file(source: str | Path) -> Any:
    """The data of the YAML config file ``source``, read within the bounds above; a
    ConfigError (one line) for a missing, oversized, bounded-out, non-UTF-8 or malformed
    file, or one without a mapping at its top level."""
    p = Path(source)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist (or is not a file)")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config file {p} is larger than a config can be "
            f"({MAX_CONFIG_BYTES} bytes); point at the run's YAML file."
        )
    try:
        data = safe_yaml(p.read_text())
    except _YamlBoundError as exc:
        raise ConfigError(
            f"config file {p} has {exc}: refused (an alias bomb?); write the values out."
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {p} is not UTF-8 text ({exc.reason} at byte "
            f"{exc.start}); save it as UTF-8 YAML."
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(
            f"config file {p} is not valid YAML ({what}{where}); fix its "
            "syntax (see deploy/examples/run.yaml)."
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping at the top level")
    return data
