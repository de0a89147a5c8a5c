"""The generator of docs/config.md (``python -m pipeline.config > docs/config.md``): every
section and field of :class:`PipelineConfig` with its type, default and description, and
the prose after a section's table. tests/pipeline/test_pipeline.py keeps the page in sync."""

from __future__ import annotations

import re
from typing import Any

from .models import PipelineConfig


def _type_name(t: Any) -> str:
    if isinstance(t, type):
        return t.__name__
    text = str(t).replace("typing.", "").replace("NoneType", "None")
    for cls in (str, int, float, bool, dict, list):
        text = text.replace(f"<class '{cls.__name__}'>", cls.__name__)
    if text.startswith("Union[") and text.endswith("]"):
        text = " | ".join(part.strip() for part in text[6:-1].split(", ") if part)
    return re.sub(r"\bpipeline\.config\.(\w+\.)*", "", text).replace("__main__.", "")


#: prose after a section's table in docs/config.md (the policies its fields select)
REFERENCE_NOTES: dict[str, str] = {
    "input": """### Feature columns (CSV and Parquet)

Which columns of a table are features (pipeline/data/features.py):

- **Numeric** columns (integers, floats) are features. Without `input.columns`, every
  column except `id_column`, `label_column` and `exclude_columns` is a feature, in the
  table's order.
- **bool** columns are features, as 0/1. The run logs a note naming them and
  `kpca info` lists them ("bool as 0/1"); list `input.columns` or `exclude_columns` to
  leave them out.
- **Text, categorical, datetime and timedelta** columns are not features. Without
  `input.columns` they are left out with a warning naming them and their kind, recorded
  as left out in the run's features block and listed by `kpca info` ("left out (not
  numeric)"); `input.exclude_columns` leaves them out without the warning. Listed in
  `input.columns` they are refused in one line (encode them as numbers first: one-hot,
  epoch seconds...). A table with no numeric column is refused.
- NaN or infinity in a feature column stops the run naming the first row and column
  (`nonfinite: drop` drops such rows instead).

The run records what it used, its *features block*: names in order, dtypes, bool
columns, the id and label columns, the columns left out, and how the features were
chosen (`columns`: listed in `input.columns`; `all`: every column but the id, label,
excluded and non-numeric ones; `positions`: NPY and zarr input, whose columns have no
names). It is saved with the model (its `features`
block: `KernelPCA.feature_names_in_` and `features_` after `kpca_dask.load`) and in
the manifest (`input.features`); `kpca info` lists it.

`kpca transform RUN DATA` (and `--inverse`) selects the model's features from a table
**by name, in any order**, and carries the run's id and label columns when the table has
them (no flags needed for a table shaped like the training one; `--id-column` and
`--label-column` override). A missing feature is refused in one line naming it. A
column that is none of the features nor the id/label is refused naming it when the run
took every column as a feature (a new column means the table changed; `--ignore-extra`
embeds with the model's features anyway; columns the run excluded or left out are
ignored), and ignored with a note when the run listed
its features in `input.columns` (other columns were never features). NPY and zarr input
are taken by position, with the same number of columns as at fit. The estimator does the
same for a pandas DataFrame: `transform` selects `feature_names_in_` by name, refusing
missing or unknown columns (docs/sklearn.md).

### Validation: every row, before anything starts

`kpca validate`, and the start of `kpca run`, `kpca update` (its batch) and
`kpca transform` (its rows), read the input's header and a sample for the quick checks
(columns, types), then **every row once**, streaming (pipeline/data/scan.py: pyarrow's
streaming CSV and Parquet readers; NPY in row blocks), before any Dask cluster or
Prefect server starts. They report, each with the exact row (0-based, as `kpca info`
counts; CSV: the file's line too) and column of its first occurrence: NaN or infinity in
a feature (unless `nonfinite: drop`, which reports how many rows it will drop), text in
a numeric column, a missing label, a missing id and a repeated id (ids are join keys: a
run refuses repeats; `kpca transform` logs them). A refused run leaves nothing behind. A
zarr input's metadata is checked here, its values at ingest.

Measured (`python benchmarks/bench_validate.py --rows 1000000 --cols 64 --repeat 2`,
benchmarks/results/validate-1000000x64-2026-11-26.json): 1 000 000 rows x 64 float64
features plus an int64 id above 2**53 and a text label -- a 797 MB CSV file in **47 s**
(best of 2; 21 000 rows/s), a 650 MB Parquet file in **4.0 s** (250 000 rows/s). The
machine was shared (2 cores, load average 27-40 during the run), so these are upper
bounds; the CSV pass is pyarrow's parser, multi-threaded on a quiet machine.

### Ids

The id column is kept exactly as the source has it: a CSV column whose every value is
written as an integer (`9007199254740993`, `-12`; no `+`, no leading zero, no `1.0`) is
int64 -- read as such, never through float64, which holds integers exactly only up to
2**53 -- any other CSV column is text (`"007"` stays `"007"`); a Parquet column keeps its
type. Choosing int64 or text reads the CSV's id column once more at ingest (a streaming
pass over that column).
""",
}


def reference_markdown() -> str:
    """docs/config.md: every section and field with its type, default and description."""
    lines = [
        "# Pipeline configuration reference",
        "",
        "Generated from `pipeline/config.py` (`python -m pipeline.config > docs/config.md`);",
        "a test keeps it in sync. Unknown keys are refused. Example: "
        "`deploy/examples/run.yaml`.",
        "",
    ]
    for name, field in PipelineConfig.model_fields.items():
        model = field.annotation
        lines += [
            f"## `{name}`",
            "",
            (model.__doc__ or "").strip().splitlines()[0],
            "",
            "| field | type | default | description |",
            "|---|---|---|---|",
        ]
        for fname, f in model.model_fields.items():
            default = (
                "required"
                if f.is_required()
                else ("{}" if f.default_factory is dict else repr(f.default))
            )
            typ = _type_name(f.annotation).replace("|", "\\|")
            desc = (f.description or "").replace("|", "\\|")
            lines.append(f"| `{fname}` | `{typ}` | `{default}` | {desc} |")
        lines.append("")
        if name in REFERENCE_NOTES:
            lines += [REFERENCE_NOTES[name].strip(), ""]
    return "\n".join(lines)
