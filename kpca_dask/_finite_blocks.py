"""The NaN/inf check of a dask array inside its blocks' tasks (one read of the array for
the check and what follows it; :mod:`kpca_dask.one_pass`)."""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from .exceptions import InvalidInputError
from .validation import column_label


def _finite_block(x: np.ndarray, names: Any = None, block_info: Any = None) -> np.ndarray:
    """``x`` itself, or the :func:`check_finite` error naming this block's rows."""
    bad = ~np.isfinite(x)
    if not bad.any():
        return x
    r0, r1 = block_info[0]["array-location"][0] if block_info else (0, x.shape[0])
    c0 = block_info[0]["array-location"][1][0] if block_info else 0
    cols = np.flatnonzero(bad.any(axis=0))
    more = f" (and {cols.size - 1} other column(s))" if cols.size > 1 else ""
    i = int(np.flatnonzero(bad.any(axis=1))[0])
    j = int(np.flatnonzero(bad[i])[0])
    col, value = column_label(j + c0, names), float(x[i, j])
    raise InvalidInputError(
        f"X contains NaN or infinity ({int(bad.sum())} value(s) in rows {r0}-{r1 - 1}; the "
        f"first in row {r0 + i}, column {col}, value {value!r})"
        f"{more}. Remove or impute them before transforming (the pipeline's ingest can "
        "drop such rows with nonfinite='drop')."
    )


def checked_blocks(Xd: da.Array, names: Any = None) -> da.Array:
    """``Xd`` whose every block is checked for NaN/inf in its own task when computed (one
    read of ``Xd`` for the check and what follows it, where :func:`check_finite` is a pass
    of its own): the error names the rows of the block found first, not of the first
    block."""
    return Xd.map_blocks(_finite_block, names=names, dtype=Xd.dtype, meta=Xd._meta)
