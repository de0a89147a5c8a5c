"""A text value ("n/a") in a numeric column of a batch or an input table (issue 37): one
line naming the column, the first offending row and its value -- in CSV and Parquet, in
the first rows and past the sample -- without talk of ``input.columns`` (an update sets
them from its base run; the user never did) and without suggesting to drop a feature the
model needs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.config import InputConfig
from pipeline.data.validate import validate_input

FEATURES = ["a", "b", "c"]


def _table(path: Path, bad_row: int, value: str, n: int = 600) -> Path:
    df = pd.DataFrame(
        np.random.default_rng(0).standard_normal((n, 3)).round(6), columns=FEATURES
    )
    df["name"] = [f"r{i}" for i in range(n)]
    df["b"] = df["b"].map(repr)  # Parquet: a string column (as a text value makes it)
    df.loc[bad_row, "b"] = value
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    else:
        df.to_parquet(path)
    return path


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("bad_row", [7, 450])  # inside the 200-row sample, and past it
def test_batch_with_a_text_value_names_column_row_and_value(tmp_path, suffix, bad_row):
    # "n/a" is a missing value to pandas' CSV reader (the NaN check names it): the CSV
    # case uses another word
    value = "n/a" if suffix == ".parquet" else "unknown"
    path = _table(tmp_path / f"batch{suffix}", bad_row, value)
    # as kpca update checks its batch: the base run's features as input.columns
    v = validate_input(InputConfig(path=str(path), columns=FEATURES))
    errors = [f.message for f in v.findings if f.level == "error"]
    assert len(errors) == 1, errors
    line = errors[0]
    assert "\n" not in line
    assert f"column 'b' holds text where numbers are expected: '{value}' in row {bad_row}" in (
        line
    )
    assert "input.columns" not in line and "drop" not in line and "leave" not in line
    assert "fix or remove that row" in line


def test_a_text_column_listed_as_feature_is_still_told_to_encode(tmp_path):
    df = pd.DataFrame({"a": [1.0, 2.0, 3.0], "note": ["x", "y", "z"]})
    df.to_parquet(tmp_path / "t.parquet")
    v = validate_input(InputConfig(path=str(tmp_path / "t.parquet"), columns=["a", "note"]))
    errors = [f.message for f in v.findings if f.level == "error"]
    assert len(errors) == 1 and "input.columns ['note'] are not numeric" in errors[0]
