"""Centre stage: row means and grand mean of the training kernel matrix.

``mu = K 1 / n`` is one product with the block kernel matrix -- a distributed
reduction over the stored upper blocks (or the evaluated ones, when K is not
materialised) -- and ``g = mean(mu)``. The randomized solver fuses it into its
first pass (one extra column of ones: no pass of its own), the dense solver
takes it from the matrix it centres; the solve stage saves the statistics here,
in ``<work>/centre.zarr``, and with the model.
"""

from __future__ import annotations

import numpy as np

from .store import Location

__all__ = ["save_centring"]


def save_centring(store: Location, row_means: np.ndarray, grand_mean: float) -> None:
    g = store.open_group("w")
    z = g.create_array("row_means", shape=row_means.shape, dtype="f8",
                       chunks=(min(len(row_means), 1 << 20),))
    z[...] = row_means
    g.attrs.update({"grand_mean": float(grand_mean), "status": "complete"})
