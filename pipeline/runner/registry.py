"""The stage registry: how a stage is declared, and the config view it runs on.

The plain run, the Prefect flow, its tasks and its cache keys all derive from a
:class:`Registry` of :class:`Stage` declarations (the pipeline's own is
:data:`pipeline.stages.REGISTRY`, ``kpca update``'s
:data:`pipeline.update.run.UPDATE_REGISTRY`).

Each :class:`Stage` declares

* its ``name`` and the function that does the work (``run``);
* the config slice it reads (``config``: section names or dotted fields). The function
  is called with a :class:`ConfigView` of that slice only: reading any other field raises
  :class:`ConfigSliceError` naming the stage and the field, so the slice -- which is
  also what the stage's cache key hashes -- cannot silently fall behind the code;
* its inputs (``inputs``: the results of earlier stages, by the name they are passed
  under), the name of its own result (``result``) and that result's type
  (``result_type``: a frozen dataclass of pipeline/runner/results.py carrying its stores as
  locations with their storage options; None: plain JSON data). Results are small
  descriptors (locations, counts, content fingerprints; never arrays). The stage
  function takes and returns the typed form; :meth:`Stage.__call__` is the one place
  that converts from and to the JSON form the Prefect tasks pass, persist and hash
  (``fingerprint`` and ``fresh`` work on that JSON form);
* the artifacts it publishes under ``<out>`` (``publishes``: a reader-visible path is
  about to change, so the flow withdraws the manifest first);
* ``fingerprint``: content checksums the flow adds to the result, so that dependants'
  cache keys and the freshness check see content, not only configuration;
* ``fresh``: whether a cached result still describes what is on disk (None if it
  does, else why not).

Adding or removing a stage in a registry is the only edit the plain run, the flow and
the cache need (tests/pipeline/test_stages.py shows it with a toy stage).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.errors import InternalError

from .results import from_json, to_json

__all__ = [
    "LAYOUT_FIELDS",
    "RUN_CONTROL",
    "VOLATILE",
    "ConfigSliceError",
    "ConfigView",
    "Registry",
    "Stage",
    "config_slice",
    "identity",
]

#: Every stage finds its stores through the run layout, which reads these fields.
LAYOUT_FIELDS = ("output.path", "output.storage_options")

#: Config fields that steer a run but never change its artifacts: never in a cache key
#: (``kpca run --overwrite`` or another cluster address must not re-publish a run).
RUN_CONTROL = (
    "output.overwrite",
    "output.keep_versions",
    "output.retention_grace_hours",
    "cluster",
)

#: Run statistics in stage results: they differ between two runs that produce identical
#: stores, so they never enter a dependant's key.
VOLATILE = frozenset(
    {"seconds", "fit_seconds", "reused", "computed", "skipped", "bytes_written", "timings"}
)


# ------------------------------------------------------------------ config slices
class ConfigSliceError(InternalError, RuntimeError):
    """A stage read a config field outside its declared slice: a bug in the stage or in
    its declaration (pipeline/stages/), never the user's."""


def _parse_fields(fields: Iterable[str]) -> dict[str, frozenset[str] | None]:
    """``("kernel", "solver.dtype")`` -> ``{"kernel": None, "solver": {"dtype"}}``
    (None: the whole section)."""
    out: dict[str, set[str] | None] = {}
    for f in fields:
        section, _, name = f.partition(".")
        if not name:
            out[section] = None
        elif section not in out or out[section] is not None:
            out.setdefault(section, set()).add(name)  # type: ignore[union-attr]
    return {k: (None if v is None else frozenset(v)) for k, v in out.items()}


def _slice_error(stage: str, field: str, allowed: Iterable[str]) -> ConfigSliceError:
    return ConfigSliceError(
        f"stage {stage!r} read config field {field!r}, which is outside its declared config "
        f"slice ({', '.join(sorted(allowed))}); add {field!r} to the stage's config in its "
        f"declaration, pipeline/stages/{stage}_stage.py or pipeline/update/run.py (it is part "
        "of the stage's cache key)."
    )


class _SectionView:
    """One config section, restricted to the fields a stage declared."""

    __slots__ = ("_fields", "_name", "_section", "_stage")

    def __init__(self, section: Any, stage: str, name: str, fields: frozenset[str]):
        object.__setattr__(self, "_section", section)
        object.__setattr__(self, "_stage", stage)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        if attr not in self._fields:
            raise _slice_error(
                self._stage, f"{self._name}.{attr}", (f"{self._name}.{f}" for f in self._fields)
            )
        return getattr(self._section, attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(f"config.{self._name} is read-only in stage {self._stage!r}")

    def __repr__(self) -> str:
        return f"<{self._name} fields {sorted(self._fields)} of stage {self._stage!r}>"


class ConfigView:
    """What a stage sees of the validated :class:`~pipeline.config.PipelineConfig`: the
    sections and fields it declared, and nothing else (:class:`ConfigSliceError`)."""

    __slots__ = ("_cfg", "_fields", "_sections", "_stage")

    def __init__(self, cfg: PipelineConfig, stage: str, fields: Iterable[str]):
        if isinstance(cfg, ConfigView):
            cfg = cfg._cfg
        fields = tuple(fields)
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "_stage", stage)
        object.__setattr__(self, "_fields", fields)
        object.__setattr__(self, "_sections", _parse_fields(fields))

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        if attr not in self._sections:
            raise _slice_error(self._stage, attr, self._fields)
        value = getattr(self._cfg, attr)
        names = self._sections[attr]
        return value if names is None else _SectionView(value, self._stage, attr, names)

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(f"the config is read-only in stage {self._stage!r}")

    def __repr__(self) -> str:
        return f"<config slice {list(self._fields)} of stage {self._stage!r}>"

    def to_json_dict(self) -> dict[str, Any]:
        """The slice as JSON data (nested like the config; what the cache key hashes)."""
        data = self._cfg.to_json_dict()
        out: dict[str, Any] = {}
        for section, names in self._sections.items():
            out[section] = (
                data[section] if names is None else {n: data[section][n] for n in sorted(names)}
            )
        return out

    def model_copy(self, *, deep: bool = False) -> ConfigView:
        """A copy with the same slice (a stage may adjust its own copy, e.g. the solve's
        resolved gamma)."""
        return ConfigView(self._cfg.model_copy(deep=deep), self._stage, self._fields)


def _check_fields(stage: str, fields: Iterable[str]) -> None:
    """Every declared field exists in the config model (a misspelling fails at import)."""
    for f in fields:
        section, _, name = f.partition(".")
        sec = PipelineConfig.model_fields.get(section)
        if sec is None or (name and name not in sec.annotation.model_fields):
            raise ValueError(
                f"stage {stage!r} declares config field {f!r}, which the "
                "pipeline config does not have"
            )


def config_slice(*fields: str) -> tuple[str, ...]:
    """``fields`` as a stage declares them: a section whose every field is listed is
    named whole (``kernel``), the rest stay dotted; duplicates dropped, order kept."""
    listed = set(fields)
    out: list[str] = []
    for f in fields:
        section, _, name = f.partition(".")
        model = PipelineConfig.model_fields[section].annotation
        whole = not name or all(f"{section}.{n}" in listed for n in model.model_fields)
        out.append(section if whole or section in listed else f)
    return tuple(dict.fromkeys(out))


# ---------------------------------------------------------------------- registry
def _always_fresh(cfg: Any, inputs: dict[str, Any], result: Any) -> str | None:
    return None


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline (see the module docstring)."""

    name: str
    run: Callable[..., Any]
    config: tuple[str, ...]
    result: str
    inputs: tuple[str, ...] = ()
    publishes: tuple[str, ...] = ()
    fingerprint: Callable[[Any, Any], Any] | None = None
    fresh: Callable[[Any, dict[str, Any], Any], str | None] = _always_fresh
    #: arguments the runner supplies that are this run's facts, never part of a key
    run_info: tuple[str, ...] = ()
    #: reads the input source (outside the run): its files' state is part of the key
    reads_source: bool = False
    doc: str = ""
    #: the type of the result (pipeline/runner/results.py; None: plain JSON data)
    result_type: type | None = None
    #: the types of the inputs, by name (filled in by the :class:`Registry` from the
    #: producing stages' ``result_type``)
    input_types: tuple[tuple[str, type | None], ...] = field(default=(), compare=False)

    @property
    def fields(self) -> tuple[str, ...]:
        """The config slice the stage receives: its declaration plus the layout's fields."""
        return tuple(dict.fromkeys(self.config + LAYOUT_FIELDS))

    def view(self, cfg: PipelineConfig) -> ConfigView:
        return ConfigView(cfg, self.name, self.fields)

    def __call__(self, cfg: PipelineConfig, **inputs: Any) -> Any:
        """Run the stage on its config slice and the named inputs: the one place where
        results are converted, JSON form (or typed) in, JSON form out."""
        types = dict(self.input_types)
        args = {k: from_json(types.get(k), v) for k, v in inputs.items()}
        return to_json(self.run(self.view(cfg), **args))

    def with_fingerprint(self, cfg: PipelineConfig, result: Any) -> Any:
        return result if self.fingerprint is None else self.fingerprint(self.view(cfg), result)

    def stale_reason(
        self, cfg: PipelineConfig, inputs: dict[str, Any], result: Any
    ) -> str | None:
        """Why a cached ``result`` no longer describes the stores (None: it still does)."""
        try:
            return self.fresh(self.view(cfg), inputs, result)
        except ConfigSliceError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unreadable or missing store
            return f"its stores cannot be read ({type(exc).__name__}: {exc})"

    def key_config(self, cfg: PipelineConfig) -> dict[str, Any]:
        """The config slice as its cache key sees it: run control removed."""
        data = self.view(cfg).to_json_dict()
        for path in RUN_CONTROL:
            section, _, name = path.partition(".")
            if not name:
                data.pop(section, None)
            elif isinstance(data.get(section), dict):
                data[section].pop(name, None)
        return data


class Registry:
    """Stages in the order they run; each stage's inputs are earlier stages' results."""

    def __init__(self, stages: Iterable[Stage]):
        self._stages = tuple(stages)
        seen: dict[str, type | None] = {}
        names: set[str] = set()
        typed = []
        for s in self._stages:
            if s.name in names or s.result in seen:
                raise ValueError(f"stage {s.name!r}: its name or result name is taken")
            missing = [i for i in s.inputs if i not in seen]
            if missing:
                raise ValueError(
                    f"stage {s.name!r} takes {missing}, which no earlier stage returns"
                )
            _check_fields(s.name, s.config)
            names.add(s.name)
            seen[s.result] = s.result_type
            typed.append(replace(s, input_types=tuple((i, seen[i]) for i in s.inputs)))
        self._stages = tuple(typed)

    def __iter__(self) -> Iterator[Stage]:
        return iter(self._stages)

    def __len__(self) -> int:
        return len(self._stages)

    def __getitem__(self, name: str) -> Stage:
        for s in self._stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self._stages)

    def replace(self, stages: Iterable[Stage]) -> Registry:
        return Registry(stages)

    def without(self, name: str) -> Registry:
        return Registry(s for s in self._stages if s.name != name)

    def with_stage(self, stage: Stage, *, before: str | None = None) -> Registry:
        """A copy with ``stage`` inserted before ``before`` (default: at the end)."""
        stages = list(self._stages)
        at = len(stages) if before is None else self.names.index(before)
        return Registry(stages[:at] + [stage] + stages[at:])


def identity(result: Any) -> Any:
    """A stage result without its run statistics (:data:`VOLATILE`), and with paths
    inside an output's versions (``.../versions/<id>/model``) named without the version:
    the same content written into the next version is the same result."""
    if isinstance(result, dict):
        return {k: identity(v) for k, v in result.items() if k not in VOLATILE}
    if isinstance(result, (list, tuple)):
        return [identity(v) for v in result]
    if isinstance(result, str) and "/versions/" in result:
        return _VERSION_IN_PATH.sub("/versions/*", result)
    return result


_VERSION_IN_PATH = re.compile(r"/versions/[^/]+(?=/|$)")
