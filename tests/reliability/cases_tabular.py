"""Tabular cases of the bad-input catalogue (issue 15): an exclusion naming no column, NaN
named by its column, and new data whose columns do not match the model's features (CLI
and estimator), each refused in one line naming the columns."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .catalogue import Case, N
from .helpers import blobs

COLS = ["a", "b", "c", "d"]


def _frame(n=N, seed=0) -> pd.DataFrame:
    df = pd.DataFrame(blobs(n, len(COLS), seed=seed), columns=COLS)
    df.insert(0, "id", np.arange(n))
    return df


def _run(ctx, df, name="x.csv", **input_over):
    path = ctx.dir / name
    if name.endswith(".csv"):
        df.to_csv(path, index=False)
    else:
        df.to_parquet(path, index=False)
    return ["run", ctx.config(path, input={"id_column": "id", **input_over})]


def _exclude_unknown(ctx):
    return _run(ctx, _frame(), exclude_columns=["nope"])


# NaN past the rows `kpca run` samples before it starts (pipeline/data/validate.py): found by
# the ingest stage's pass over every row
FAR = 3 * N


def _nan_named(ctx):
    df = _frame(FAR)
    df.loc[FAR - 7, "c"] = np.nan
    return _run(ctx, df)


def _nan_named_labelled(ctx):
    df = _frame(FAR).assign(label=np.repeat(["x", "y"], FAR // 2))
    df.loc[FAR - 17, "b"] = np.nan
    return _run(ctx, df, label_column="label")


def _model_folder(ctx):
    """A saved model fitted on a table's four columns, as a run records them."""
    from kpca_dask import KernelPCA

    df = _frame()
    m = KernelPCA(2, kernel="rbf", gamma=0.1).fit(df[COLS])
    m.record_features(COLS, dtypes=["float64"] * 4, id_column="id", selection="all")
    m.save(ctx.dir / "model")
    return ctx.dir / "model"


def _tr_missing(ctx):
    model = _model_folder(ctx)
    _frame(10, seed=3).drop(columns=["b"]).to_csv(ctx.dir / "new.csv", index=False)
    return ["transform", model, ctx.dir / "new.csv", ctx.dir / "emb.zarr"]


def _tr_extra(ctx):
    model = _model_folder(ctx)
    _frame(10, seed=3).assign(e=1.0).to_csv(ctx.dir / "new.csv", index=False)
    return ["transform", model, ctx.dir / "new.csv", ctx.dir / "emb.zarr"]


def _est(ctx, change):
    from kpca_dask import KernelPCA

    df = _frame(60)[COLS]
    m = KernelPCA(2, kernel="rbf", gamma=0.1).fit(df)
    return lambda: m.transform(change(df))


CASES = [
    Case(
        "tab-exclude-unknown",
        "input",
        "input.exclude_columns names a column the table lacks",
        _exclude_unknown,
        ("input.exclude_columns ['nope'] are not columns of", "available"),
    ),
    Case(
        "tab-nan-column",
        "input",
        "NaN in a named feature column",
        _nan_named,
        ("contains NaN or infinity", "in column 'c'", "set input.nonfinite: drop"),
    ),
    Case(
        "tab-nan-column-labelled",
        "input",
        "NaN in a named feature column of a labelled table",
        _nan_named_labelled,
        (f"(first: row {FAR - 17}, column 'b')", "set input.nonfinite: drop"),
    ),
    Case(
        "tr-missing-feature",
        "transform",
        "new data lacking one of the model's features",
        _tr_missing,
        (
            "lacks the feature column(s) ['b'] the model was fitted on",
            "add them (any order: columns are matched by name)",
        ),
    ),
    Case(
        "tr-extra-column",
        "transform",
        "new data with a column the model was not fitted on",
        _tr_extra,
        (
            "has column(s) ['e'] the model was not fitted on",
            "drop them, or pass --ignore-extra",
        ),
    ),
    Case(
        "est-columns-missing",
        "estimator",
        "DataFrame without one of the fitted columns",
        lambda c: _est(c, lambda df: df.drop(columns=["b"])),
        ("yet now missing: ['b']", "Add the missing ones", "X[model.feature_names_in_]"),
    ),
    Case(
        "est-columns-extra",
        "estimator",
        "DataFrame with a column not seen at fit",
        lambda c: _est(c, lambda df: df.assign(e=0.0)[["e", *COLS[::-1]]]),
        ("unseen at fit time: ['e']", "Drop the columns the model does not know"),
    ),
]
