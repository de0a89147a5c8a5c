"""The one validated configuration of a pipeline run (pydantic v2, loadable from YAML).

Every field is documented (``Field(description=...)``), unknown keys are
refused, and values are checked with messages that name the field and the
fix. ``PipelineConfig.from_yaml(path)`` uses ``yaml.safe_load``: a config file
can never execute code. Secrets never belong here: object-store credentials
come from the environment (or a Prefect block in the flows), and storage
options that look like credentials are refused.

The package by concern (every name is imported from ``pipeline.config``):

- ``sections``, ``stage_sections``: the section models; ``models``: :class:`PipelineConfig`,
  :func:`load_config` and the absolute-path helpers;
- ``credentials``: credential screening of storage options and URLs;
- ``messages``: :class:`ConfigError` and the one-line summary of a ValidationError;
- ``loader``: YAML read within bounds (size, aliases, nodes);
- ``storage_options``: a command's ``--storage-options``;
- ``docs_reference``: the generator of docs/config.md (``python -m pipeline.config``).
"""

from __future__ import annotations

from .credentials import NON_SECRET_VALUES, SECRET_KEYS, SECRET_WORDS, check_storage_options
from .credentials import _secret_value as _secret_value
from .docs_reference import REFERENCE_NOTES, reference_markdown
from .loader import MAX_CONFIG_BYTES, MAX_YAML_ALIASES, MAX_YAML_NODES
from .messages import ConfigError, format_validation_error
from .models import PipelineConfig, absolute_path, load_config, with_absolute_paths
from .sections import (
    MIN_WORKER_MEMORY,
    ChunkConfig,
    ClusterConfig,
    InputConfig,
    KernelConfig,
    KernelStoreConfig,
    OutputConfig,
    SolverConfig,
    TLSConfig,
)
from .stage_sections import (
    RESERVED_NAMES,
    SGD_MIN_ROWS,
    DenoiseConfig,
    EvaluateConfig,
    PreprocessConfig,
    UpdateConfig,
)
from .storage_options import MAX_OPTIONS_BYTES, parse_storage_options

__all__ = [
    "InputConfig",
    "KernelConfig",
    "SolverConfig",
    "ChunkConfig",
    "KernelStoreConfig",
    "OutputConfig",
    "TLSConfig",
    "ClusterConfig",
    "DenoiseConfig",
    "EvaluateConfig",
    "PreprocessConfig",
    "PipelineConfig",
    "RESERVED_NAMES",
    "SGD_MIN_ROWS",
    "ConfigError",
    "check_storage_options",
    "load_config",
    "parse_storage_options",
    "format_validation_error",
    # also imported from here by the pipeline, flows, tests and benchmarks
    "UpdateConfig",
    "absolute_path",
    "with_absolute_paths",
    "reference_markdown",
    "REFERENCE_NOTES",
    "MIN_WORKER_MEMORY",
    "MAX_CONFIG_BYTES",
    "MAX_YAML_ALIASES",
    "MAX_YAML_NODES",
    "MAX_OPTIONS_BYTES",
    "SECRET_KEYS",
    "SECRET_WORDS",
    "NON_SECRET_VALUES",
]
