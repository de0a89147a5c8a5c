"""Centre stage: row means and grand mean of the training kernel matrix.

``mu = K 1 / n`` is one product with the block kernel matrix -- a distributed
reduction that reads each stored upper block once (or evaluates it, when K is
not materialised) -- and ``g = mean(mu)``. The statistics are saved in
``<work>/centre.zarr`` and with the model. When K is not materialised the
randomized solver fuses this reduction into its first pass instead (one pass
saved), and this stage only records what the solver computed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dask.array as da
import numpy as np

from kpca_dask.gram import BlockKernelMatrix
from kpca_dask.kernels import Kernel

from .store import Location

__all__ = ["compute_centring", "save_centring", "load_centring"]

logger = logging.getLogger("pipeline")


def compute_centring(X: da.Array, kernel: Kernel, dtype: Any,
                     block_reader: Any = None) -> tuple[np.ndarray, float, float]:
    """``(row_means, grand_mean, seconds)`` by one pass over the (stored) blocks."""
    t0 = time.perf_counter()
    K = BlockKernelMatrix(X, kernel, dtype, block_reader=block_reader)
    s = K.product(np.ones((K.n, 1)))
    mu = s[:, 0] / K.n
    g = float(mu.mean())
    secs = time.perf_counter() - t0
    logger.info("centre: row means of %d rows from %s in %.1f s (grand mean %.6g)", K.n,
                "stored blocks" if block_reader is not None else "evaluated blocks", secs, g)
    return mu, g, secs


def save_centring(store: Location, row_means: np.ndarray, grand_mean: float) -> None:
    g = store.open_group("w")
    z = g.create_array("row_means", shape=row_means.shape, dtype="f8",
                       chunks=(min(len(row_means), 1 << 20),))
    z[...] = row_means
    g.attrs.update({"grand_mean": float(grand_mean), "status": "complete"})


def load_centring(store: Location) -> tuple[np.ndarray, float] | None:
    if not store.exists():
        return None
    g = store.open_group("r")
    if g.attrs.get("status") != "complete":
        return None
    return np.asarray(g["row_means"][...]), float(g.attrs["grand_mean"])
