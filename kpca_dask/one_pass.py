"""A fitted model's transform in one pass over its rows.

``KernelPCA.transform`` of a dask array first reads it once to refuse NaN/inf (so the
error comes before a lazy graph is returned, as scikit-learn raises in ``transform``),
then the graph reads it again. Where ``X`` lives on a store and is large, that first pass
is a second read of every byte: :func:`transform` moves the check into each block's task
instead. The result is the same array; a NaN/inf still raises
:class:`~kpca_dask.InvalidInputError` naming its row, column and value, but when the
graph is computed, naming the block found first rather than the first block. The
pipeline's embedding uses it (its rows come from an ingest store).
"""

from __future__ import annotations

from typing import Any

from . import _transform

__all__ = ["transform"]


def transform(model: Any, X: Any) -> Any:
    """``model.transform(X)``, reading a dask or zarr ``X`` once (numpy ``X`` is checked
    up front, as ``transform`` does: it is in memory)."""
    return _transform.project(model, X, "transform", finite_pass=False)
