"""Project stage: the embedding of every ingested row, in zarr (and Parquet).

The embedding keeps the ingested row chunks; see :func:`write_embedding` for
how training and held-out rows are embedded.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dask.array as da
import numpy as np

from pipeline.output import DENSE, Location
from pipeline.runtime import compute

from .parquet import component_names, write_parquet
from .transform import embed_rows

# write_parquet and component_names live in pipeline/embed/parquet.py (transform writes Parquet
# too); re-exported here for the callers that import them from the stage
__all__ = ["component_names", "write_embedding", "write_parquet"]

logger = logging.getLogger("pipeline")


def write_embedding(
    model: Any,
    X: da.Array,
    out: Location,
    *,
    split: np.ndarray | None = None,
    name: str = "embedding",
    one_read: bool = False,
) -> dict:
    """Write the embedding of every row of ``X`` to the zarr array ``<out>/<name>``.

    Exact models: the training rows' embedding is ``V sqrt(lambda)`` (what
    ``fit_transform`` returns; ``transform`` on those rows reproduces it to the
    solver's certified residual), held-out rows (``split == 0``) go through
    ``transform``. This avoids an n x n evaluation for the training rows.
    Nyström models: ``transform`` for every row (O(n m), streaming).
    """
    t0 = time.perf_counter()
    rows = X.chunks[0]
    emb = embed_rows(model, X, split=split, dtype=model.dtype_, one_read=one_read)
    g = out.open_group("a")
    if name in g:
        del g[name]
    z = g.create_array(
        name, shape=emb.shape, dtype=emb.dtype, chunks=(rows[0], emb.shape[1]), config=DENSE
    )
    z.attrs["columns"] = component_names(emb.shape[1])
    compute(da.store(emb, z, lock=False, compute=False), label="embedding")
    secs = time.perf_counter() - t0
    logger.info("project: embedded %d rows into %s/%s in %.1f s", X.shape[0], out, name, secs)
    return {"rows": int(X.shape[0]), "components": int(emb.shape[1]), "seconds": secs}
