"""A batch of one row merges like any other (issue 36: "a 1-row batch cannot be merged":
the update checked its batch with the fit's rule of at least 2 rows). Checked against an
independent reference: Nyström features of every row and scipy's eigh."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kpca_dask.exceptions import InvalidInputError
from kpca_dask.update import update

from .test_update import _data, _dense_reference, _model


@pytest.mark.parametrize("how", ["update", "partial_fit", "dataframe"])
def test_one_row_batches_merge_exactly(how):
    X0 = _data(400, 0)
    rows = _data(3, 5)
    est = _model().fit(X0)
    for r in rows:
        batch = r[None, :]
        if how == "update":
            update(est, batch)
        elif how == "partial_fit":
            est.partial_fit(batch)
        else:
            update(est, pd.DataFrame(batch))
    U = np.vstack([X0, rows])
    assert est.n_samples_fit_ == U.shape[0] == 403
    lam, _, _ = _dense_reference(est, U)
    assert np.abs(est.eigenvalues_ - lam).max() / lam.max() < 1e-9


def test_an_empty_batch_is_refused_in_one_line():
    est = _model().fit(_data(200, 0))
    with pytest.raises(InvalidInputError, match="found 0 sample") as exc:
        update(est, np.empty((0, 4)))
    assert "\n" not in str(exc.value)
