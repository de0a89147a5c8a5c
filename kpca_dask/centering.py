"""Centring in feature space, applied implicitly.

With ``H = I - 11^T / n``, the centred kernel matrix is ``Kc = H K H``. Writing
``mu = K 1 / n`` (row means; K is symmetric, so also column means) and
``g = 1^T K 1 / n^2`` (grand mean)::

    Kc = K - mu 1^T - 1 mu^T + g 11^T

Neither ``H`` nor ``Kc`` is ever formed, and ``K`` is never copied to be
centred: a product is ``Kc Z = H (K (H Z))`` (centre the columns of ``Z``,
multiply, centre the columns of the result), and the first product of a solve
appends a column of ones to ``Z`` so that ``mu`` and ``g`` come out of the same
pass over the kernel blocks.

New points are centred with the training statistics (Schölkopf, Smola and
Müller 1998): ``kc(x) = k(x, X) - mu - mean(k(x, X)) + g``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from .gram import BlockKernelMatrix
from .threads import blas_threads_for_dask

__all__ = ["centre_columns", "CentredKernel", "centre_cross_kernel"]

logger = logging.getLogger("kpca_dask")


def centre_columns(Z: np.ndarray) -> np.ndarray:
    """``H Z``: subtract each column's mean (returns a new array)."""
    return Z - Z.mean(axis=0, keepdims=True)


def centre_cross_kernel(kx: np.ndarray, row_means: np.ndarray, grand_mean: float) -> np.ndarray:
    """Centre ``kx = k(new, X)`` (m x n) with the training statistics."""
    return kx - row_means[None, :] - kx.mean(axis=1, keepdims=True) + grand_mean


@dataclass
class CentredKernel:
    """The implicit operator ``Kc = H K H`` on top of a block kernel matrix.

    Each :meth:`matmul` is one pass over the upper kernel blocks. Until the
    first pass has run, ``row_means`` and ``grand_mean`` are ``None``.
    """

    K: BlockKernelMatrix
    row_means: np.ndarray | None = None
    grand_mean: float | None = None
    n_passes: int = 0
    pass_seconds: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return self.K.n

    def _product(self, Z: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        with blas_threads_for_dask():
            Y = self.K.product(Z)
        self.n_passes += 1
        self.pass_seconds.append(time.perf_counter() - t0)
        logger.debug(
            "kernel pass %d (%d columns) took %.2f s",
            self.n_passes,
            Z.shape[1],
            self.pass_seconds[-1],
        )
        return Y

    def matmul(self, Z: np.ndarray) -> np.ndarray:
        """``Kc @ Z`` (one pass). The first call also yields ``row_means``/``grand_mean``."""
        Z = np.asarray(Z, dtype=np.float64)
        HZ = centre_columns(Z)
        if self.row_means is None:
            # Fuse the row means into the first pass: one extra column of ones.
            Y = self._product(np.hstack([HZ, np.ones((self.n, 1))]))
            self.row_means = Y[:, -1] / self.n
            self.grand_mean = float(self.row_means.mean())
            Y = Y[:, :-1]
        else:
            Y = self._product(HZ)
        return centre_columns(Y)

    def compute_means(self) -> None:
        """Run the row-mean reduction alone (used when no other pass is due)."""
        if self.row_means is None:
            Y = self._product(np.ones((self.n, 1)))
            self.row_means = Y[:, 0] / self.n
            self.grand_mean = float(self.row_means.mean())
