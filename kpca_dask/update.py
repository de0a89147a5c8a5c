"""Exact updates of Nyström models with new rows.

A Nyström model with fixed landmarks is determined by sums over the rows
(:class:`~kpca_dask.solvers.nystroem.NystroemStatistics`: the m x m cross
product of the shifted kernel values against the landmarks, their column sums,
the row count and the kernel trace). A model fitted with ``keep_statistics``
keeps them; :func:`update` adds a batch's sums (one distributed pass over the
batch, an m x m tree reduction) and re-solves the m x m eigenproblem on the
driver. The result equals a fit on all rows with the same landmarks, to
rounding (tests/kpca_dask/test_update.py: eigenvalues 1e-10 relative, embeddings 1e-8).

Nothing of the earlier rows is read again: the update costs ``n_new m^2``
flops, independent of how many rows the model has seen.

Exact models have no such statistics (their model is the n x n kernel matrix's
eigenvectors); they are refitted on every row, warm-started:
:func:`warm_start_vectors` extends the old eigenvectors to the new rows by the
Nyström extension (``v(x) = emb(x) / sqrt(lambda)``, the model's own transform),
and ``KernelPCA.fit(X_all, v0=...)`` starts the randomized solver from them. The
certificate is the same as a cold fit's; the start only makes it hold sooner.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import validation
from ._solve import Solution
from .exceptions import InvalidInputError, NotUpdatableError
from .precision import check_centred_scale
from .solvers import EigResult
from .solvers.nystroem import (
    NystroemBasis,
    NystroemStatistics,
    batch_statistics,
    nystroem_basis,
    solve_statistics,
)
from .threads import blas_threads_for_dask

__all__ = [
    "apply_statistics",
    "check_updatable",
    "model_basis",
    "rows_statistics",
    "update",
    "warm_start_vectors",
]

REFIT = "refit it on all rows with eigen_solver='nystroem' (keep_statistics is on by default "
REFIT += "for the covariance method; pass keep_statistics=True for any)"


def check_updatable(est: Any, where: str = "the model") -> None:
    """Refuse (NotUpdatableError, one line) a model that cannot take rows exactly."""
    est._check_fitted()
    if getattr(est, "eigen_solver_", None) != "nystroem":
        raise NotUpdatableError(
            f"{where} is an exact ({est.eigen_solver_}) model: only Nyström models update "
            "exactly with new rows; refit on all rows (or fit with eigen_solver='nystroem')."
        )
    if getattr(est, "statistics_", None) is None:
        raise NotUpdatableError(
            f"{where} keeps no sufficient statistics (fitted by an older kpca-dask or with "
            f"keep_statistics off), so new rows cannot be added exactly; {REFIT}."
        )
    if getattr(est, "fit_inverse_transform", False):
        raise NotUpdatableError(
            f"{where} has a pre-image map (fit_inverse_transform) trained on the old "
            "embedding, which an update would make stale; refit on all rows instead."
        )


def model_basis(est: Any) -> NystroemBasis:
    """The model's landmark basis (``W = k(Z, Z)`` decomposed as at fit, same shift)."""
    return nystroem_basis(est.landmarks_, est.kernel_, est._dtype, shift=est.statistics_.shift)


def _rows(est: Any, X: Any):
    # not validate_fit_input: its "at least 2 rows" is a fit's rule (a centred kernel
    # matrix of one row is zero); a batch's rows are sums added to the model's, and a
    # batch of one row merges like any other (issue 36: "a 1-row batch cannot be merged")
    Xd, _ = validation.as_dask_array(X)  # refuses an empty X in one line
    d = int(Xd.shape[1])
    if d != est.n_features_in_:
        raise InvalidInputError(
            f"X has {d} features, but the model was fitted with {est.n_features_in_}; "
            "pass the same feature columns as at fit."
        )
    names = validation.feature_names(X)
    fitted = getattr(est, "feature_names_in_", None)
    if names is not None and fitted is not None and list(names) != list(fitted):
        raise InvalidInputError(
            "X's feature names differ from those seen at fit; pass the same columns "
            "in the same order."
        )
    validation.check_finite(Xd)
    scaler = getattr(est, "preprocess_", None)
    if scaler is not None:  # the model's scaling, fitted on its first rows, stays fixed
        Xd = scaler.transform(Xd)
    r = int(getattr(est, "chunk_size_", 8192) or 8192)
    return Xd.rechunk({0: r, 1: -1})


def rows_statistics(est: Any, X: Any, basis: NystroemBasis | None = None) -> NystroemStatistics:
    """The sufficient statistics of new rows ``X`` against the model's landmarks (one
    distributed pass; nothing is changed)."""
    check_updatable(est)
    Xb = _rows(est, X)
    basis = model_basis(est) if basis is None else basis
    with blas_threads_for_dask():
        return batch_statistics(Xb, basis)


#: what a merged model keeps of its fit's ``solver_info_``: the landmarks, which are still
#: the fit's. The solve's entries (a randomized fit's certificate, passes and block sizes,
#: where it ran) described pairs the merge replaced: a reader would take the old
#: certificate for the new pairs'.
FIT_INFO_KEPT = ("solver", "landmarks", "landmark_seconds", "n_landmarks")


def apply_statistics(est: Any, stats: NystroemStatistics, basis: NystroemBasis | None = None):
    """Set ``est``'s fitted attributes to the model of ``stats`` (same landmarks)."""
    basis = model_basis(est) if basis is None else basis
    k = est.n_components
    fit = solve_statistics(basis, stats, k)
    lam, A, resid = fit.eigenvalues, fit.projection, fit.residuals
    if k is not None and lam.size < k:  # as a fit: zero pairs, dropped by select_eigenpairs
        pad = k - lam.size
        lam = np.concatenate([lam, np.zeros(pad)])
        A = np.hstack([A, np.zeros((A.shape[0], pad))])
        resid = np.concatenate([resid, np.full(pad, np.nan)])
    old = dict(getattr(est, "solver_info_", {}) or {})
    info = {
        **{key: old[key] for key in FIT_INFO_KEPT if key in old},
        **fit.info,
        "update": {"n_rows": int(stats.n_rows)},
    }
    res = EigResult(lam, A, resid, n_passes=0, converged=True, info=info)
    extra = {
        "landmark_indices_": est.landmark_indices_,
        "n_landmarks_": int(est.n_landmarks_),
        "landmark_method_": est.landmark_method_,
        "nystroem_method_": "covariance",
        "mean_weights_": fit.mean_weights,
        "statistics_": stats,
    }
    sol = Solution(
        res,
        fit.column_means,
        fit.grand_mean,
        fit.kernel_trace,
        "nystroem",
        est.landmarks_,
        extra,
    )
    est.n_samples_fit_ = int(stats.n_rows)
    est._apply_solution(sol, int(stats.n_rows))
    check_centred_scale(est)  # as a fit: rounding above tol is said, and not converged_
    return est


def update(est: Any, X: Any) -> Any:
    """Add the rows ``X`` to a Nyström model that keeps its statistics, exactly: the
    model becomes the fit on all rows seen so far with the same landmarks."""
    check_updatable(est)
    basis = model_basis(est)
    batch = rows_statistics(est, X, basis)
    return apply_statistics(est, est.statistics_ + batch, basis)


def warm_start_vectors(est: Any, X_new: Any) -> np.ndarray:
    """Starting vectors for refitting the exact model ``est`` on its training rows
    followed by the rows ``X_new`` (in that order: ``fit(vstack([X_train, X_new]),
    v0=...)``).

    The old eigenvectors (unit columns of the training kernel matrix's) on the old
    rows, and on each new row ``x`` their Nyström extension ``emb(x) / sqrt(lambda)``
    (``emb``: the model's transform, its scaling and centring included): the
    eigenvector equation ``Kc v = lambda v`` read at a row that was not in ``Kc``.
    When the batch is drawn from the training distribution these are close to the
    eigenvectors of the union, so the randomized solver certifies after fewer
    passes than from random vectors (docs/update.md has the counts). The scaling
    or ``gamma="scale"`` refitted on the union moves the kernel a little; the start
    stays good and the result is the cold fit's either way.

    Returns an ``(n_samples_fit_ + len(X_new), n_components_)`` float64 array.
    """
    est._check_fitted()
    if getattr(est, "eigen_solver_", None) == "nystroem":
        raise NotUpdatableError(
            "warm_start_vectors: a Nyström model updates exactly with new rows "
            "(kpca_dask.update.update, or partial_fit); warm starts are for exact models."
        )
    lam = np.asarray(est.eigenvalues_, dtype=np.float64)
    keep = lam > 0
    if not keep.any():
        raise NotUpdatableError("warm_start_vectors: the model has no positive eigenvalue.")
    emb = est.transform(X_new)
    if hasattr(emb, "compute"):
        with blas_threads_for_dask():
            emb = emb.compute()
    V_new = np.asarray(emb, dtype=np.float64)[:, keep] / np.sqrt(lam[keep])
    V_old = np.asarray(est.eigenvectors_, dtype=np.float64)[:, keep]
    return np.vstack([V_old, V_new])
