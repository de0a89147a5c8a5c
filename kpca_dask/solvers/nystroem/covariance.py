"""The centred feature covariance ``Sigma`` of the rows of X: as an operator, one pass per
product (:class:`FeatureCovariance`), and as sufficient statistics that add over row sets
(:class:`NystroemStatistics`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np

from ...threads import blas_threads_for_dask, blas_threads_for_driver
from .basis import NystroemBasis
from .passes import block_stats_graph
from .worker_passes import NystroemWorkerPasses, worker_client

__all__ = ["FeatureCovariance", "NystroemStatistics", "batch_statistics"]

logger = logging.getLogger("kpca_dask")


@dataclass
class NystroemStatistics:
    """Sums over rows that determine the Nyström eigenproblem for fixed landmarks.

    With ``C' = k(X, Z) - 1 shift^T`` (kernel values against the landmarks, shifted by a
    fixed vector to avoid cancellation): ``colsum = C'^T 1`` (m,), ``cross = C'^T C'``
    (m x m, symmetric), ``n_rows`` and ``kernel_trace = sum_i k(x_i, x_i)``, all float64.
    Every one is a sum over rows, so the statistics of a union of row sets are the sums
    of theirs (``a + b``): a model that keeps them updates exactly with new rows
    (:func:`solve_statistics` on the sum equals a fit on all rows with the same
    landmarks). ``Sigma = T^T (cross - colsum colsum^T / n) T``.
    """

    shift: np.ndarray
    n_rows: int
    colsum: np.ndarray
    cross: np.ndarray
    kernel_trace: float

    def __add__(self, other: NystroemStatistics) -> NystroemStatistics:
        if self.shift.shape != other.shift.shape or not np.array_equal(self.shift, other.shift):
            raise ValueError("statistics taken with different landmark shifts cannot be added")
        return NystroemStatistics(
            self.shift,
            self.n_rows + other.n_rows,
            self.colsum + other.colsum,
            self.cross + other.cross,
            self.kernel_trace + other.kernel_trace,
        )

    @property
    def delta(self) -> np.ndarray:
        """``c - shift`` with ``c`` the mean kernel value at each landmark."""
        return self.colsum / self.n_rows

    @property
    def column_means(self) -> np.ndarray:
        return self.shift + self.delta

    def sigma(self, basis: NystroemBasis) -> np.ndarray:
        """The centred feature covariance ``Sigma`` (m' x m') of the rows summed here."""
        R = self.cross - self.n_rows * np.outer(self.delta, self.delta)
        S = basis.T.T @ R @ basis.T
        return (S + S.T) / 2

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a saved model keeps (``n_rows`` and ``kernel_trace`` are scalars of
        the model already)."""
        return {"stat_shift": self.shift, "stat_colsum": self.colsum, "stat_cross": self.cross}


def batch_statistics(X: da.Array, basis: NystroemBasis) -> NystroemStatistics:
    """The statistics of the rows of ``X`` (row-chunked dask array): one pass with an
    m x m tree reduction over row blocks, on the current Dask scheduler."""
    op = FeatureCovariance(X, basis)
    try:
        with blas_threads_for_driver():
            return op.statistics()
    finally:
        op.release()


@dataclass
class FeatureCovariance:
    """``Sigma = T^T C_c^T C_c T`` (m' x m') as an operator: one pass over X per product.

    The first product also yields ``delta = c - c0`` (hence the column means
    ``c``) and ``trace(K)``. Implements the ``n``/``matmul`` protocol of
    :func:`~kpca_dask.solvers.randomized.randomized_eigh`.

    On a distributed client with the dask config ``kpca.nystroem-driver: workers`` the
    passes run on :class:`~.worker_passes.NystroemWorkerPasses` (one task per worker a
    pass, the rows resident on the workers until :meth:`release`).
    """

    X: da.Array
    basis: NystroemBasis
    delta: np.ndarray | None = None
    kernel_trace: float | None = None
    n_passes: int = 0
    pass_seconds: list[float] = field(default_factory=list)
    #: the per-worker driver once a pass chose it (None: the default driver)
    worker_driver: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self._Zp = self.basis.prepared()

    def _worker_passes(self) -> NystroemWorkerPasses | None:
        """The per-worker driver when the config and the scheduler ask for it."""
        if self.worker_driver is None:
            client = worker_client()
            if client is not None:
                self.worker_driver = NystroemWorkerPasses(self.X, self.basis, self._Zp, client)
        return self.worker_driver

    def release(self) -> None:
        """Drop what the per-worker driver keeps on the workers (nothing otherwise)."""
        if self.worker_driver is not None:
            self.worker_driver.release()
            self.worker_driver = None

    @property
    def n(self) -> int:
        return self.basis.rank

    @property
    def n_rows(self) -> int:
        return int(self.X.shape[0])

    def _pass(self, M: np.ndarray | None) -> np.ndarray:
        return self._run(M, sums=self.delta is None)[0]

    def _run(self, M: np.ndarray | None, sums: bool) -> tuple:
        """One pass over the rows: ``(acc, colsum, diag, rows)`` of block_stats_graph
        (column sums and the kernel trace when ``sums``); the first pass sets ``delta``
        and ``kernel_trace``."""
        first = self.delta is None
        t0 = time.perf_counter()
        with blas_threads_for_dask():
            driver = self._worker_passes()
            if driver is not None:
                out = driver.run(M, sums)
            else:
                (out,) = dask.compute(block_stats_graph(self.X, self.basis, self._Zp, M, sums))
        acc, colsum, diag, rows = out
        if rows != self.n_rows:  # pragma: no cover - a graph bug, never data
            raise RuntimeError(f"pass covered {rows} of {self.n_rows} rows")
        if first:
            self.delta = colsum / self.n_rows
            self.kernel_trace = diag
        self.n_passes += 1
        self.pass_seconds.append(time.perf_counter() - t0)
        logger.debug(
            "Nyström pass %d (%s) took %.2f s",
            self.n_passes,
            "covariance" if M is None else f"{M.shape[1]} columns",
            self.pass_seconds[-1],
        )
        return out

    def matmul(self, Y: np.ndarray) -> np.ndarray:
        """``Sigma @ Y`` for Y of shape (m', l): one pass."""
        M = (self.basis.T @ np.asarray(Y, dtype=np.float64)).astype(self.basis.dtype)
        R = self._pass(M)
        M64 = M.astype(np.float64)
        R -= self.n_rows * np.outer(self.delta, self.delta @ M64)
        return self.basis.T.T @ R

    def covariance(self) -> np.ndarray:
        """The whole ``Sigma`` (m' x m'): one pass with an m x m reduction."""
        return self.statistics().sigma(self.basis)

    def statistics(self) -> NystroemStatistics:
        """The rows' :class:`NystroemStatistics`: one pass with an m x m reduction (sets
        ``delta`` and ``kernel_trace`` when this is the first pass)."""
        acc, colsum, diag, rows = self._run(None, sums=True)
        acc += np.triu(acc, 1).T  # upper triangle of C'^T C' (the lower one is zero)
        return NystroemStatistics(
            np.array(self.basis.shift, dtype=np.float64), int(rows), colsum, acc, float(diag)
        )

    @property
    def column_means(self) -> np.ndarray:
        """``c = mean_i k(x_i, z_j)`` (after the first pass)."""
        return self.basis.shift + self.delta
