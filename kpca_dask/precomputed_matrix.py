"""A kernel matrix given by the caller (``kernel="precomputed"``), read block by block."""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from .block_matrix import BlockKernelMatrix
from .block_products import _sum_parts, stored_pair_products
from .exceptions import InvalidInputError
from .params import KERNEL_CACHE_MODES


def _precomputed_task(kij, kji, zi, zj, dtype, symmetrise_diag):
    """``(K_IJ @ zj, K_IJ^T @ zi)`` for one upper block of a caller-given K, using its
    symmetric part ``(K + K^T) / 2`` when ``kji`` (the mirror block) is given or a
    diagonal block is to be symmetrised."""
    if kji is not None:
        kij = 0.5 * (np.asarray(kij, dtype=np.float64) + np.asarray(kji, dtype=np.float64).T)
    elif symmetrise_diag:
        kij = np.asarray(kij, dtype=np.float64)
        kij = 0.5 * (kij + kij.T)
    return stored_pair_products(np.asarray(kij), zi, zj, dtype)


def _inspect_pair(kij, kji):
    """Non-finite count, ``max |K_IJ - K_JI^T|`` and ``max |K_IJ|`` of one block pair."""
    kij = np.asarray(kij, dtype=np.float64)
    kji = kij if kji is None else np.asarray(kji, dtype=np.float64)
    bad = int(np.count_nonzero(~np.isfinite(kij)))
    if kji is not kij:
        bad += int(np.count_nonzero(~np.isfinite(kji)))
    if bad:
        return bad, np.inf, np.inf
    asym = float(np.max(np.abs(kij - kji.T))) if kij.size else 0.0
    top = float(max(np.max(np.abs(kij)), np.max(np.abs(kji)))) if kij.size else 0.0
    return 0, asym, top


class PrecomputedKernelMatrix(BlockKernelMatrix):
    """A kernel matrix given by the caller (``kernel="precomputed"``), never copied whole.

    ``K`` is any n x n dask array (from numpy, zarr, a scipy.sparse matrix...),
    rechunked into ``block_rows`` square blocks. Products read each upper block
    ``K_IJ`` (``I <= J``) once per pass and use it for both ``K_IJ Z_J`` and
    ``K_IJ^T Z_I``, as for a stored kernel. A matrix that is not exactly
    symmetric is used through its symmetric part ``(K + K^T) / 2`` (what
    scikit-learn's centring and ``eigh`` amount to): then each task reads its
    mirror block too, doubling the reads. :meth:`inspect` (one read of K)
    decides which, and finds NaN/inf.
    """

    def __init__(
        self,
        K: da.Array,
        dtype: Any = np.float64,
        block_rows: int = 2048,
        symmetric: bool | None = None,
    ):
        from .kernels import PrecomputedKernel

        if K.ndim != 2 or K.shape[0] != K.shape[1]:
            raise InvalidInputError(
                f"Precomputed matrix must be a square matrix. Input is a "
                f"{K.shape[0]}x{K.shape[1]} matrix; with kernel='precomputed' fit takes the "
                "n x n kernel matrix of the training rows."
            )
        r = max(1, min(int(block_rows), int(K.shape[0])))
        self.X = K.rechunk((r, r))
        self.kernel = PrecomputedKernel()
        self.dtype = np.dtype(dtype)
        self.block_reader = None
        self._products = 0
        self._cache = None
        self._cache_pending = False
        self.symmetric = symmetric

    def plan_cache(self, mode: str = "auto", solver: str = "randomized") -> dict[str, Any]:
        """A precomputed K is the caller's array: read at every pass, never cached here."""
        if mode not in KERNEL_CACHE_MODES:
            raise InvalidInputError(
                f"kernel_cache must be one of {KERNEL_CACHE_MODES}, got {mode!r}."
            )
        return {
            "requested": mode,
            "tier": "precomputed",
            "reason": "kernel='precomputed': the given matrix is read at every pass",
        }

    def inspect(self) -> tuple[int, float, float]:
        """One read of K: (non-finite values, max asymmetry, max |K|); sets ``symmetric``."""
        import dask

        blocks = self.X.to_delayed()
        nb = self.n_blocks
        inspect = dask.delayed(_inspect_pair, pure=True)
        results = dask.compute(
            *[
                inspect(blocks[i, j], None if i == j else blocks[j, i])
                for i in range(nb)
                for j in range(i, nb)
            ]
        )
        bad = sum(r[0] for r in results)
        asym = max(r[1] for r in results)
        top = max(r[2] for r in results)
        self.symmetric = bad == 0 and asym == 0.0
        return bad, asym, top

    def _pair_graph(self, Z, rows: range, token: str) -> tuple[dict, list, str]:
        nb = self.n_blocks
        pname = "kpca-pkz-part-" + token
        oname = "kpca-pkz-" + token
        dsk: dict[Any, Any] = {}
        deps: list[Any] = [self.X]
        zkey = self._z_source(Z, dsk, deps, token)
        kn = self.X.name
        sym = bool(self.symmetric)
        contrib: dict[int, list] = {j: [] for j in range(rows.start, nb)}
        for i in rows:
            for j in range(i, nb):
                if i == j:
                    task = (
                        _precomputed_task,
                        (kn, i, i),
                        None,
                        zkey(i),
                        None,
                        self.dtype.str,
                        not sym,
                    )
                else:
                    task = (
                        _precomputed_task,
                        (kn, i, j),
                        None if sym else (kn, j, i),
                        zkey(i),
                        zkey(j),
                        self.dtype.str,
                        False,
                    )
                dsk[(pname, i, j)] = task
                contrib[i].append(((pname, i, j), 0))
                if i != j:
                    contrib[j].append(((pname, i, j), 1))
        for j, parts in contrib.items():
            dsk[(oname, j - rows.start, 0)] = (
                _sum_parts,
                [k for k, _ in parts],
                [w for _, w in parts],
            )
        return dsk, deps, oname

    def diag(self) -> da.Array:
        return da.diagonal(self.X).astype(np.float64)

    def to_numpy(self) -> np.ndarray:
        K = np.asarray(self.X.compute(), dtype=np.float64)
        if not self.symmetric:
            K = 0.5 * (K + K.T)
        return K.astype(self.dtype, copy=False)
