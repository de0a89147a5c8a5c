"""Which columns of a table are features: the policy, the record, and the match at transform.

The policy (docs/config.md, "Feature columns"), applied by the readers
(pipeline/data/readers/) to CSV and Parquet input:

- numeric columns (integer, float) are features;
- bool columns are features, as 0/1; the log names them (a note, not a warning);
- text, categorical, datetime, timedelta and other non-numeric columns are not
  features: without ``input.columns`` they are left out with a warning that names them
  and their kind, and recorded as left out (``kpca info`` lists them); listed in
  ``input.columns`` they are refused in one line (encode them as numbers first);
- the id and label columns are never features.

The ingest stage records the outcome as the run's *features block* (:func:`record`):
names in order, dtypes, bool columns, the id and label columns, the columns left out,
and how the features were chosen (``"columns"``: listed in ``input.columns``;
``"all"``: every column but the id, label, excluded and non-numeric ones). The solve
stage stores it in the model (``KernelPCA.record_features``, the model's ``"features"``
block) and the manifest has it under ``input.features``; ``kpca info`` lists it.

At transform, :func:`match` reads a new table's columns against the block: the model's
features are selected by name in any order; a missing feature is refused naming it; a
column the model does not know is refused naming it (the run took every column, or the
model was fitted on a DataFrame: a new column means the table changed), and ignored with
a note when the run listed its features in ``input.columns`` (the other columns were
never features) or with ``ignore_extra``.
The run's id and label columns are reused when the new table has them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from pipeline.errors import UserError

from .formats import column_hint

logger = logging.getLogger("pipeline")

__all__ = ["FeatureError", "Match", "Selection", "kind_of", "match", "record", "select"]

#: what each kind of column is, in the error messages
_KIND_WORDS = {
    "text": "text",
    "categorical": "categorical",
    "datetime": "datetime",
    "timedelta": "timedelta",
    "complex": "complex",
    "other": "non-numeric",
}


class FeatureError(UserError, ValueError):
    """A table's columns cannot be used as they are (one line: the columns and the fix)."""


def kind_of(dtype: Any) -> str:
    """ "numeric", "bool", "text", "categorical", "datetime", "timedelta", "complex" or
    "other" for a pandas/numpy dtype."""
    api = pd.api.types
    try:
        if api.is_bool_dtype(dtype):
            return "bool"
        if isinstance(dtype, pd.CategoricalDtype):
            return "categorical"
        if api.is_datetime64_any_dtype(dtype):
            return "datetime"
        if api.is_timedelta64_dtype(dtype):
            return "timedelta"
        if api.is_complex_dtype(dtype):
            return "complex"
        if api.is_numeric_dtype(dtype):
            return "numeric"
        if api.is_string_dtype(dtype) or api.is_object_dtype(dtype):
            return "text"
    except TypeError:
        pass
    return "other"


def _names(cols: list[str], limit: int = 10) -> str:
    shown = ", ".join(repr(str(c)) for c in cols[:limit])
    return f"[{shown}{f', ... ({len(cols)} in all)' if len(cols) > limit else ''}]"


def _kinds(cols: list[str], dtypes: dict[str, Any]) -> str:
    return ", ".join(
        f"{c!r} ({_KIND_WORDS.get(kind_of(dtypes[c]), 'non-numeric')})" for c in cols
    )


@dataclass(frozen=True)
class Selection:
    """The feature columns of a table, in order, and what the policy noted about them."""

    features: list[str]
    dtypes: list[str]
    bools: list[str] = field(default_factory=list)
    selection: str = "all"  # "columns" (input.columns) or "all"
    excluded: list[str] = field(default_factory=list)
    #: non-numeric columns left out of "all", with their dtypes
    ignored: list[str] = field(default_factory=list)
    ignored_dtypes: list[str] = field(default_factory=list)


def select(
    path: str,
    available: list[str],
    dtypes: dict[str, Any],
    *,
    columns: list[str] | None = None,
    exclude: list[str] | None = None,
    id_column: str | None = None,
    label_column: str | None = None,
) -> Selection:
    """Apply the policy to a table's columns (``dtypes``: name -> dtype); FeatureError
    names the columns that break it and the fix."""
    reserved = [c for c in (id_column, label_column) if c is not None]
    exclude = list(exclude or [])
    unknown = [c for c in exclude if c not in available]
    if unknown:
        raise FeatureError(
            f"input.exclude_columns {_names(unknown)} are not columns of {path}; "
            f"available: {_names(available, 20)}."
        )
    if columns:
        features, ignored = _listed(path, available, dtypes, columns, reserved, exclude), []
        selection = "columns"
    else:
        features, ignored = _numeric(path, available, dtypes, reserved, exclude)
        selection = "all"
    bools = [c for c in features if kind_of(dtypes[c]) == "bool"]
    if bools:
        logger.info(
            "ingest: bool column(s) %s used as 0/1 features (list input.columns or "
            "input.exclude_columns to leave them out)",
            _names(bools),
        )
    return Selection(
        features=[str(c) for c in features],
        dtypes=[str(dtypes[c]) for c in features],
        bools=[str(c) for c in bools],
        selection=selection,
        excluded=[str(c) for c in exclude],
        ignored=[str(c) for c in ignored],
        ignored_dtypes=[str(dtypes[c]) for c in ignored],
    )


def _listed(
    path: str,
    available: list[str],
    dtypes: dict[str, Any],
    columns: list[str],
    reserved: list[str],
    exclude: list[str],
) -> list[str]:
    """input.columns, checked: present, neither reserved nor excluded, listed once,
    numeric or bool."""
    missing = [c for c in columns if c not in available]
    if missing:
        raise FeatureError(
            f"input.columns {_names(missing)} are not in {path}; available: "
            f"{_names(available, 20)}"
        )
    both = [c for c in columns if c in reserved or c in exclude]
    if both:
        raise FeatureError(
            f"input.columns {_names(both)} are also the id, label or an excluded column; "
            "a column is either a feature or not: remove it from one of the lists."
        )
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:
        raise FeatureError(f"input.columns lists {_names(twice)} more than once.")
    bad = [c for c in columns if kind_of(dtypes[c]) not in ("numeric", "bool")]
    if bad:
        raise FeatureError(
            f"input.columns {_names(bad)} are not numeric "
            f"({[str(dtypes[c]) for c in bad]}); drop them from input.columns or "
            "encode them as numbers."
        )
    return list(columns)


def _numeric(
    path: str,
    available: list[str],
    dtypes: dict[str, Any],
    reserved: list[str],
    exclude: list[str],
) -> tuple[list[str], list[str]]:
    """Every numeric or bool column not reserved or excluded, and the others (left out
    with a warning); FeatureError when there is none."""
    candidates = [c for c in available if c not in reserved and c not in exclude]
    bad = [c for c in candidates if kind_of(dtypes[c]) not in ("numeric", "bool")]
    if len(bad) == len(candidates):  # none, or none numeric
        raise FeatureError(
            f"{path} has no numeric feature columns (columns: {_names(available, 20)}); "
            "set input.columns."
        )
    if bad:
        logger.warning(
            "ingest: leaving out non-numeric column(s) %s: not features (encode them as "
            "numbers to use them; list input.columns, or input.exclude_columns to leave "
            "them out without this warning)",
            _kinds(bad[:10], dtypes) + (f", ... ({len(bad)} in all)" if len(bad) > 10 else ""),
        )
    return [c for c in candidates if c not in set(bad)], bad


def record(
    sel: Selection | None,
    columns: list[str],
    *,
    id_column: str | None,
    label_column: str | None,
    source_format: str,
) -> dict[str, Any]:
    """The run's features block (JSON): what was used and how it was chosen."""
    if sel is None:  # NPY or zarr: no names; the columns are positions x0, x1, ...
        return {
            "names": list(columns),
            "dtypes": None,
            "bool_columns": [],
            "id_column": None,
            "label_column": None,
            "selection": "positions",
            "excluded": [],
            "ignored": [],
            "source_format": source_format,
        }
    return {
        "names": list(sel.features),
        "dtypes": list(sel.dtypes),
        "bool_columns": list(sel.bools),
        "id_column": id_column,
        "label_column": label_column,
        "selection": sel.selection,
        "excluded": list(sel.excluded),
        "ignored": [{"name": c, "dtype": t} for c, t in zip(sel.ignored, sel.ignored_dtypes)],
        "source_format": source_format,
    }


@dataclass(frozen=True)
class Match:
    """How a new table's columns map onto a model's features."""

    features: list[str]  # the columns to read, in the model's order
    id_column: str | None
    label_column: str | None
    ignored: list[str]  # columns neither features nor id/label, ignored


def match(
    block: dict[str, Any],
    path: str,
    available: list[str],
    *,
    id_column: str | None = None,
    label_column: str | None = None,
    ignore_extra: bool = False,
    what: str = "transform",
) -> Match:
    """Map a new table's columns (``available``) onto the model's features block.

    ``id_column``/``label_column``: given by the user (else the run's, when the table
    has them). FeatureError names a missing feature, or a column the model does not know
    unless the run listed its features (``selection == "columns"``) or ``ignore_extra``.
    ``what``: the command (``transform``, ``update``) named in the messages; the same
    rules and words for both.
    """
    names = list(block["names"])
    run_id, run_label = block.get("id_column"), block.get("label_column")
    for flag, col in (("--id-column", id_column), ("--label-column", label_column)):
        if col is not None and col not in available:
            raise FeatureError(
                f"{flag} {col!r} is not a column of {path}; " + column_hint(col, available)
            )
    if id_column is None and run_id in available:
        id_column = run_id
    if label_column is None and run_label in available:
        label_column = run_label
    missing = [c for c in names if c not in available]
    if missing:
        raise FeatureError(
            f"{path} lacks the feature column(s) {_names(missing)} the model was fitted on "
            f"({len(names)} features: {_names(names, 5)}); add them (any order: columns are "
            "matched by name)."
        )
    reserved = {c for c in (id_column, label_column, run_id, run_label) if c is not None}
    extra = [c for c in available if c not in set(names) and c not in reserved]
    excluded = set(block.get("excluded") or []) | {
        c["name"] if isinstance(c, dict) else c for c in block.get("ignored") or []
    }
    unknown = [c for c in extra if c not in excluded]
    if unknown and block.get("selection") != "columns" and not ignore_extra:
        had = ", ".join(
            [f"its {len(names)} features"]
            + [f"the {w} column {c!r}" for w, c in (("id", run_id), ("label", run_label)) if c]
        )
        raise FeatureError(
            f"{path} has column(s) {_names(unknown)} the model was not fitted on (its "
            f"training table had only {had}); drop them, or pass --ignore-extra to "
            f"{'embed' if what == 'transform' else 'add the rows'} with the model's features "
            "only."
        )
    if extra:
        logger.info(
            "%s: ignoring column(s) %s that are not features of the model", what, _names(extra)
        )
    return Match(features=names, id_column=id_column, label_column=label_column, ignored=extra)
