"""The whole run's config, :class:`PipelineConfig`, and how one is loaded and made
independent of the folder a command ran in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from .loader import read_config_file
from .messages import ConfigError, format_validation_error
from .sections import (
    ChunkConfig,
    ClusterConfig,
    InputConfig,
    KernelConfig,
    KernelStoreConfig,
    OutputConfig,
    SolverConfig,
    _Model,
)
from .stage_sections import DenoiseConfig, EvaluateConfig, PreprocessConfig, UpdateConfig


class PipelineConfig(_Model):
    """A whole pipeline run."""

    input: InputConfig
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    kernel: KernelConfig = Field(default_factory=KernelConfig)
    solver: SolverConfig = Field(default_factory=SolverConfig)
    chunks: ChunkConfig = Field(default_factory=ChunkConfig)
    kernel_store: KernelStoreConfig = Field(default_factory=KernelStoreConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    denoise: DenoiseConfig = Field(default_factory=DenoiseConfig)
    update: UpdateConfig = Field(default_factory=UpdateConfig)

    @classmethod
    def from_yaml(cls, path: str | Path) -> PipelineConfig:
        """Load and validate a YAML file (``yaml.safe_load``: no code runs)."""
        return load_config(path)

    def to_json_dict(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


def load_config(source: str | Path | dict[str, Any]) -> PipelineConfig:
    """Validate a config from a YAML path or a dict; raise ConfigError listing every problem."""
    name = str(source) if not isinstance(source, dict) else "the given mapping"
    data = source if isinstance(source, dict) else read_config_file(source)
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, name)) from None


def absolute_path(path: str) -> str:
    """A local path made absolute against the current folder (``file://`` kept); URLs
    and the names refused elsewhere as "no folder of its own" (``""``, ``.``, ``..``)
    unchanged. What a manifest or lineage records must not depend on the folder a command
    ran in: a series started with ``--output runs/v1`` is updated from anywhere."""
    import os

    raw = str(path)
    if "://" in raw and not raw.startswith("file://"):
        return raw
    prefix = "file://" if raw.startswith("file://") else ""
    bare = raw.removeprefix("file://")
    if bare.strip().rstrip("/") in ("", ".", ".."):
        return raw
    return prefix + os.path.abspath(os.path.expanduser(bare))


def with_absolute_paths(cfg: PipelineConfig) -> PipelineConfig:
    """``cfg`` with its local input, output and update-base paths absolute
    (:func:`absolute_path`); the same object when they already are."""
    paths = {
        ("input", "path"): cfg.input.path,
        ("output", "path"): cfg.output.path,
        ("update", "base"): cfg.update.base,
    }
    fixed = {k: absolute_path(v) for k, v in paths.items() if v is not None}
    if all(fixed[k] == paths[k] for k in fixed):
        return cfg
    cfg = cfg.model_copy(deep=True)
    for (section, name), value in fixed.items():
        setattr(getattr(cfg, section), name, value)
    return cfg
