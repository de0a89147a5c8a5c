"""Command-line cases of the bad-input catalogue (issue 15): the pre-start checks of
``kpca validate`` (the same ones ``kpca run`` makes before Prefect or Dask start,
pipeline/data/validate.py), and what only the ingest stage can see (a NaN after the rows the
checks sample)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.data.validate import SAMPLE_ROWS

from .catalogue import Case, D, N
from .helpers import blobs


def _nan_after_sample(ctx):
    X = blobs(SAMPLE_ROWS + 100, D)
    X[SAMPLE_ROWS + 50, 1] = np.nan
    return ["run", ctx.config(ctx.npy(X))]


def _validate_label(ctx):
    pd.DataFrame(blobs(N, D), columns=list("abcd")).to_csv(ctx.dir / "x.csv", index=False)
    return ["validate", ctx.config(ctx.dir / "x.csv", input={"label_column": "label"})]


def _validate_complete_run(ctx):
    return ["validate", ctx.config(ctx.npy(blobs(N, D)), output={"path": str(ctx.run)})]


def _validate_output_under_a_file(ctx):
    (ctx.dir / "afile").write_text("a file, not a folder")
    return [
        "validate",
        ctx.config(ctx.npy(blobs(N, D)), output={"path": str(ctx.dir / "afile" / "out")}),
    ]


CASES = [
    Case(
        "cli-nan-after-sample",
        "input",
        "NaN after the rows the pre-start checks sample (found by the full pass)",
        _nan_after_sample,
        ("contains NaN or infinity in column 'x1' (first: row", "set input.nonfinite: drop"),
    ),
    Case(
        "cli-validate-label",
        "input",
        "`kpca validate`: the label column is not in the file",
        _validate_label,
        (
            "input.label_column 'label' is not a column of",
            "available (4 columns): ['a', 'b', 'c', 'd']",
        ),
    ),
    Case(
        "cli-validate-complete-run",
        "output",
        "`kpca validate`: a complete run is already at the output",
        _validate_complete_run,
        ("already holds a complete run", "pass --overwrite"),
    ),
    Case(
        "cli-validate-output-under-a-file",
        "output",
        "`kpca validate`: the output's parent is a file",
        _validate_output_under_a_file,
        ("cannot create output", "is a file, not a folder; choose another output.path"),
    ),
]
