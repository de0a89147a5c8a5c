"""The checks on a sample of rows, and the full streaming pass over every row
(pipeline/data/scan.py), for the pre-start checks (pipeline/data/validate.py)."""

from __future__ import annotations

from .findings import Finding, Validation

__all__ = ["check_sample_finite", "scan_rows"]


def scan_rows(cfg, v: Validation, fs, fs_path: str, fmt: str, features, dtypes=None) -> None:
    """The full pass (pipeline/data/scan.py): every row read; the first problem of each kind
    with its exact row and column."""
    from ..scan import scan

    inp = cfg.input
    labels = {inp.label_column, inp.id_column} - {None}
    res = scan(
        inp.path,
        fmt,
        fs,
        fs_path,
        features=[c for c in features if c not in labels],
        dtypes=dtypes,
        id_column=inp.id_column,
        label_column=inp.label_column,
        nonfinite=inp.nonfinite,
    )
    v.rows, v.scan_seconds, v.id_type = res.rows, res.seconds, res.id_type
    v.droppable_rows = res.droppable_rows
    for p in res.problems:
        v.findings.append(Finding(p.check, p.message))
    if res.rows == 0 and fmt != "npy" and not res.problems:
        v.findings.append(
            Finding(
                "types",
                f"{inp.path} is empty: it has a header but no data rows; point input.path "
                "at a file with data.",
            )
        )


def check_sample_finite(cfg, v: Validation, sample, features: list[str]) -> None:
    import numpy as np

    if cfg.input.nonfinite != "error" or sample.size == 0:
        return
    bad = ~np.isfinite(sample)
    if not bad.any():
        return
    cols = [features[j] for j in np.flatnonzero(bad.any(axis=0))]
    row = int(np.flatnonzero(bad.any(axis=1))[0])
    v.findings.append(
        Finding(
            "nonfinite",
            f"{cfg.input.path} contains NaN or infinity in column(s) {cols[:10]} (first: "
            f"row {row}); clean the data or set input.nonfinite: drop.",
        )
    )
