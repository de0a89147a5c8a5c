"""A command's ``--storage-options``: inline JSON or a small YAML/JSON file, screened for
credentials like a config's ``storage_options``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from .credentials import check_storage_options
from .loader import _YamlBoundError, safe_yaml
from .messages import ConfigError

#: the largest storage-options file a command reads
MAX_OPTIONS_BYTES = 64 << 10


def parse_storage_options(value: str | None, flag: str = "--storage-options") -> dict[str, Any]:
    """A command's ``--storage-options``: inline JSON (``'{"anon": true}'``) or the path
    of a small YAML/JSON file holding one mapping; ``{}`` for None or empty. Credential
    keys are refused as in a config's ``storage_options`` (ConfigError, one line)."""
    if value is None or not value.strip():
        return {}
    text = value.strip()
    if text.startswith("{"):
        source = ""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(
                f"{flag} is not valid JSON ({exc}); pass a JSON object such as "
                "'{\"anon\": true}' or the path of a YAML file."
            ) from None
    else:
        p = Path(text)
        source = f" (in {p})"
        if not p.is_file():
            raise ConfigError(
                f"{flag} {text!r} is neither a JSON object nor an existing file; pass "
                '\'{"client_kwargs": {"endpoint_url": "..."}}\' or the path of a YAML file.'
            )
        if p.stat().st_size > MAX_OPTIONS_BYTES:
            raise ConfigError(
                f"{flag} file {p} is larger than storage options can be "
                f"({MAX_OPTIONS_BYTES} bytes); point at a small YAML/JSON mapping."
            )
        try:
            data = safe_yaml(p.read_text())
        except (_YamlBoundError, yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"{flag} file {p} is not a valid YAML/JSON mapping "
                f"({str(exc).splitlines()[0]}); fix its syntax."
            ) from None
    if data is None:
        return {}
    try:
        return check_storage_options(data, flag)
    except ValueError as exc:
        raise ConfigError(f"{exc}{source}") from None
