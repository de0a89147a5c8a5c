"""The top eigenpairs of the Nyström feature covariance and the model they give
(:func:`nystroem_eigh`, :func:`solve_statistics`, :class:`NystroemFit`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np
import scipy.linalg

from ...threads import blas_threads_for_driver
from .._common import EigResult
from ..randomized import DEFAULT_N_OVERSAMPLES, randomized_eigh
from .basis import NystroemBasis
from .covariance import FeatureCovariance, NystroemStatistics
from .method import NYSTROEM_METHODS

__all__ = ["NystroemFit", "nystroem_eigh", "solve_statistics"]


@dataclass
class NystroemFit:
    """Result of :func:`nystroem_eigh`.

    Attributes
    ----------
    eigenvalues : ndarray of shape (k,)
        Top eigenvalues of Sigma, descending (approximate those of Kc).
    projection : ndarray of shape (m, k)
        ``A = T P_k``: ``embedding(x) = k(x, Z) A - offset``.
    offset : ndarray of shape (k,)
        ``c^T A``.
    column_means : ndarray of shape (m,)
        ``c = mean_i k(x_i, z_j)``.
    mean_weights : ndarray of shape (m,)
        ``W^+ c``: ``k(x, Z) . mean_weights`` is the Nyström estimate of
        ``mean_i k(x, x_i)``.
    grand_mean : float
        ``c^T W^+ c``, the Nyström estimate of the grand mean of K.
    kernel_trace : float
        ``trace(K)`` (exact).
    residuals : ndarray of shape (k,)
        ``||Sigma p - lambda p|| / lambda`` of each pair.
    """

    eigenvalues: np.ndarray
    projection: np.ndarray
    offset: np.ndarray
    column_means: np.ndarray
    mean_weights: np.ndarray
    grand_mean: float
    kernel_trace: float
    residuals: np.ndarray
    n_passes: int
    converged: bool
    info: dict[str, Any] = field(default_factory=dict)
    #: the rows' sufficient statistics (covariance method, or ``keep_statistics``)
    statistics: NystroemStatistics | None = None


def nystroem_eigh(
    X: da.Array,
    basis: NystroemBasis,
    n_components: int | None,
    *,
    method: str = "randomized",
    n_oversamples: int = DEFAULT_N_OVERSAMPLES,
    n_power_iter: int | str = "auto",
    randomized_method: str = "block_krylov",
    tol: float = 1e-7,
    max_passes: int = 20,
    random_state: Any = None,
    warn: bool = True,
    keep_statistics: bool = False,
    all_rows: bool = False,
) -> NystroemFit:
    """Top eigenpairs of the centred Nyström feature covariance of ``X``.

    Parameters
    ----------
    X : dask array of shape (n_samples, n_features)
        Row-chunked, one chunk along the features; read once per pass.
    basis : NystroemBasis
    n_components : int or None
        k; None keeps every component (covariance method only).
    method : {"covariance", "randomized"}
    n_oversamples, n_power_iter, randomized_method, tol, max_passes, random_state, warn
        As for :func:`~kpca_dask.solvers.randomized.randomized_eigh` (the
        randomized method is certified the same way; ``converged`` says
        whether the certificate holds, and a ConvergenceWarning is emitted
        when it does not and ``warn``).
    keep_statistics : bool
        Return the rows' :class:`NystroemStatistics` (``fit.statistics``) for exact
        updates. Free with the covariance method; one more pass with the randomized one.
    all_rows : bool
        The landmarks are every row of ``X`` (covariance method): ``Sigma`` is then
        formed from the basis itself (see :func:`_all_rows_sigma`), to the accuracy of the
        exact solver, instead of from the rows' cross products.
    """
    if method not in NYSTROEM_METHODS:
        raise ValueError(f"Unknown Nyström method {method!r}; use one of {NYSTROEM_METHODS}.")
    with blas_threads_for_driver():
        return _nystroem_eigh(
            X,
            basis,
            n_components,
            method,
            n_oversamples,
            n_power_iter,
            randomized_method,
            tol,
            max_passes,
            random_state,
            warn,
            keep_statistics,
            all_rows,
        )


def _all_rows_sigma(basis: NystroemBasis) -> np.ndarray:
    """``Sigma`` when the landmarks are all the rows: the rows' Nyström features are
    ``k(X, Z) T = W U S^(-1/2) = U S^(1/2)`` (``T = U S^(-1/2)``), so ``Sigma = Fc^T Fc``
    with ``F = T S``, centred over the rows.

    Maintenance note (issue 36): from the cross products, ``Sigma = T^T C'^T C' T``
    divides the rounding of the kernel values (``eps`` of the largest) by each ``S_j``:
    the eigenvalues below ~1e-4 of the top were noise, and ``n_components=None`` kept
    99 components where the exact solver and scikit-learn keep 116. This form has the
    exact solver's rounding, so with every row a landmark both keep the same pairs."""
    F = basis.T * basis.w_eigenvalues
    Fc = F - F.mean(axis=0)
    return Fc.T @ Fc


def _nystroem_eigh(
    X,
    basis,
    n_components,
    method,
    n_oversamples,
    n_power_iter,
    randomized_method,
    tol,
    max_passes,
    random_state,
    warn,
    keep_statistics=False,
    all_rows=False,
) -> NystroemFit:
    op = FeatureCovariance(X, basis)
    try:
        return _solve_op(
            op,
            basis,
            n_components,
            method,
            n_oversamples,
            n_power_iter,
            randomized_method,
            tol,
            max_passes,
            random_state,
            warn,
            keep_statistics,
            all_rows,
        )
    finally:
        op.release()  # the per-worker driver's resident rows, at the end of the fit


def _solve_op(
    op,
    basis,
    n_components,
    method,
    n_oversamples,
    n_power_iter,
    randomized_method,
    tol,
    max_passes,
    random_state,
    warn,
    keep_statistics,
    all_rows,
) -> NystroemFit:
    stats = None
    mp = basis.rank
    k = mp if n_components is None else min(int(n_components), mp)
    t0 = time.perf_counter()
    if method == "covariance":
        stats = op.statistics()
        sigma = _all_rows_sigma(basis) if all_rows else stats.sigma(basis)
        res = _eigh_sigma(sigma, k, op.n_passes)
    else:
        if n_components is None:
            raise ValueError("The randomized Nyström method needs n_components.")
        res = randomized_eigh(
            op,
            k,
            n_oversamples=n_oversamples,
            n_power_iter=n_power_iter,
            method=randomized_method,
            tol=tol,
            max_passes=max_passes,
            psd=True,
            eps=float(np.finfo(basis.dtype).eps),
            random_state=random_state,
            centre=False,
            warn=warn,
        )
    if keep_statistics and stats is None:
        stats = op.statistics()  # one more pass: the m x m sums the randomized solve avoids
    fit = _fit_from(res, basis, op.column_means, float(op.kernel_trace), method, t0)
    fit.n_passes = op.n_passes
    fit.info["pass_seconds"] = list(op.pass_seconds)
    fit.statistics = stats if keep_statistics else None
    return fit


def _fit_from(
    res: EigResult,
    basis: NystroemBasis,
    c: np.ndarray,
    kernel_trace: float,
    method: str,
    t0: float,
) -> NystroemFit:
    """The model of eigenpairs ``res`` of Sigma: projection, offset, centring vectors."""
    lam, P = np.asarray(res.eigenvalues, dtype=np.float64), np.asarray(res.eigenvectors)
    f = basis.T.T @ c
    A = basis.T @ P
    # Deterministic signs on the landmark coefficients: with all rows as
    # landmarks these are the exact solver's eigenvectors times a positive
    # scale, so both solvers then agree on every sign.
    idx = np.argmax(np.abs(A), axis=0) if A.size else np.zeros(0, dtype=int)
    signs = np.sign(A[idx, np.arange(A.shape[1])]) if A.size else np.ones(0)
    signs[signs == 0] = 1.0
    A = A * signs
    info = {
        "method": method,
        "n_landmarks": basis.m,
        "rank": basis.rank,
        "w_dropped": basis.n_dropped,
        "w_condition": float(basis.w_eigenvalues[0] / basis.w_eigenvalues[-1]),
        "pass_seconds": [],
        "seconds": time.perf_counter() - t0 if t0 else 0.0,
        **{k_: v for k_, v in res.info.items() if k_ not in ("seconds",)},
    }
    return NystroemFit(
        eigenvalues=lam,
        projection=np.ascontiguousarray(A),
        offset=c @ A,
        column_means=c,
        mean_weights=basis.T @ f,
        grand_mean=float(f @ f),
        kernel_trace=float(kernel_trace),
        residuals=np.asarray(res.residuals, dtype=np.float64),
        n_passes=res.n_passes,
        converged=bool(res.converged),
        info=info,
    )


def solve_statistics(
    basis: NystroemBasis, stats: NystroemStatistics, n_components: int | None
) -> NystroemFit:
    """The top eigenpairs of ``Sigma`` from statistics (no pass over rows): the covariance
    method's solve, the same arithmetic as :func:`nystroem_eigh` with
    ``method="covariance"``."""
    mp = basis.rank
    k = mp if n_components is None else min(int(n_components), mp)
    with blas_threads_for_driver():
        res = _eigh_sigma(stats.sigma(basis), k, 0)
        fit = _fit_from(res, basis, stats.column_means, stats.kernel_trace, "covariance", 0.0)
    fit.statistics = stats
    return fit


def _eigh_sigma(Sigma: np.ndarray, k: int, n_passes: int) -> EigResult:
    """The top ``k`` eigenpairs of the formed ``Sigma`` (descending) and their residuals."""
    mp = Sigma.shape[0]
    lam, P = scipy.linalg.eigh(Sigma, subset_by_index=(mp - k, mp - 1), check_finite=False)
    lam, P = lam[::-1], P[:, ::-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        residuals = np.linalg.norm(Sigma @ P - P * lam, axis=0) / np.abs(lam)
    return EigResult(
        lam, P, residuals, n_passes=n_passes, converged=True, info={"finish": "eigh"}
    )
