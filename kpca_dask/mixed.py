"""Mixed precision: float32 kernel blocks under a float64 model.

The randomized solver's passes read the kernel blocks over and over; in float32 the
blocks take half the memory and their products (SGEMM) half the time. The model stays
float64: the basis, Rayleigh-Ritz, the centring statistics and the results.

How the certificate accounts for the blocks (docs/precision.md):

1. The iteration runs on float32 blocks with float32 in-block products, and the
   solver is told so (``eps`` = float32's: its rounding level ``tau = eps sqrt(n)
   ||A||`` is the noise of those products). It only has to get close. With the
   kernel cache, each block is evaluated in float64 and rounded to float32.
2. The float32 blocks are released, and one more pass evaluates the kernel afresh in
   float64 and multiplies the returned vectors ``V`` (with a column of ones for exact
   row means). A Rayleigh-Ritz step on ``V`` gives the eigenpairs and their exact
   residuals ``r`` for the float64 kernel itself: the float32 blocks only shaped the
   subspace, and their rounding reaches the eigenvalues at second order.
3. :func:`recertify` certifies those pairs with the float64 solver's levels
   (``tol``, ``tol**0.75`` in clusters, ``tail_tol`` in a flat tail) and rounding
   level. What it does not know is the spectrum below the returned pairs, so a lone
   last pair is bounded by its residual alone.

If that certificate does not hold, the fit falls back to float64 blocks, warm-started
from the float32 result, and records why in ``solver_info_["mixed_precision"]``.

:func:`recertify` can also certify on the rounded blocks themselves (``rounded=True``,
no fresh evaluation): the blocks' rounding ``E = K~ - K`` is then a fixed perturbation
with ``|E_ij| <= u K_ij`` (``u`` float32's unit roundoff), so for kernels with
non-negative values (rbf, laplacian) ``||E||_2 <= u max_i sum_j K_ij``
(:func:`block_rounding`, from the exact row means), added to every eigenvalue bound
(Weyl: linear in ``delta``) and to the residuals of the angle bounds (Davis-Kahan).
It was measured and not chosen: 5e-11 relative error left in the cluster eigenvalues
at n = 10 000 (against 1e-14), and no lone eigenvalue certifiable to 1e-8.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .centering import centre_columns

__all__ = ["MIXED_KERNELS", "MIXED_MIN_SAMPLES", "MIXED_MIN_TOL", "block_rounding", "recertify"]

#: Kernels whose values are non-negative: the bound ``||E|| <= u ||K||`` holds.
MIXED_KERNELS = ("rbf", "laplacian")

#: "auto" uses float32 blocks under a float64 model from this many rows on: below it
#: the kernel is cheap and a fallback (a second solve) would cost more than it saves.
MIXED_MIN_SAMPLES = 8192

#: "auto" keeps float64 blocks for ``tol`` below this: a cluster's level ``tol**0.75``
#: (1.8e-7 at 1e-9) would be within a few units of float32's roundoff (6e-8), which
#: bounds what float32 blocks can certify for the leading eigenvalues.
MIXED_MIN_TOL = 1e-9

U32 = float(np.finfo(np.float32).eps) / 2


def block_rounding(row_means: np.ndarray, n: int, rounded: bool) -> float:
    """``delta``: a bound on ``||K~ - K||_2`` for float32-rounded blocks of a kernel with
    non-negative values, from the row means of ``K~`` (0.0 when not ``rounded``)."""
    if not rounded:
        return 0.0
    top = float(np.max(row_means)) if row_means.size else 0.0
    return U32 * n * max(top, 0.0) / (1.0 - U32)


def recertify(
    K: Any,
    V: np.ndarray,
    *,
    tol: float,
    rounded: bool,
    had_tail: bool,
) -> dict[str, Any]:
    """The float64 pass of step 2 and the certificate of steps 3-4 for the vectors ``V``
    (n x k, orthonormal) on the block matrix ``K`` (products in float64).

    Returns ``eigenvalues``, ``eigenvectors``, ``residuals`` (relative, ``r + delta``),
    ``row_means``, ``grand_mean``, ``certificate``, ``delta`` and ``seconds``."""
    from .solvers import deterministic_signs
    from .solvers.randomized import certify, default_tail_tol
    from .threads import blas_threads_for_dask

    V = _orthonormal(V)
    n, k = V.shape
    t0 = time.perf_counter()
    with blas_threads_for_dask():
        Y = K.product(np.hstack([V, np.ones((n, 1))]))
    seconds = time.perf_counter() - t0
    mu = Y[:, -1] / n
    g = float(mu.mean())
    # Kc V = H K H V, with K 1 = n mu
    AV = centre_columns(Y[:, :k] - n * np.outer(mu, V.mean(axis=0)))
    M = V.T @ AV
    w, U = np.linalg.eigh((M + M.T) / 2)
    order = np.argsort(w)[::-1]
    th, U = w[order], U[:, order]
    Vr, AVr = V @ U, AV @ U
    Rf = AVr - Vr * th
    r = np.linalg.norm(Rf, axis=0)
    delta = block_rounding(mu, n, rounded)
    floor = float(np.finfo(np.float64).eps) * np.sqrt(n) * (abs(float(th[0])) if k else 0.0)

    block_res = _block_norms(Rf)

    kw = {
        "tol": tol,
        "floor": floor,
        "cluster_rtol": min(0.05, 100.0 * np.sqrt(tol)),
        "angle_tol": float(np.sqrt(tol)),
        "below": None,
        "cluster_tol": tol**0.75,
        "tail_tol": default_tail_tol(tol) if had_tail else None,
    }
    # eigenvalues: bounds for the rounded blocks' Kc~ (exact residuals, its Ritz values),
    # then Weyl for the fixed perturbation H E H: + delta
    cert = dict(certify(th, r, k, block_res, **kw))
    # subspaces and vectors: Davis-Kahan with the true kernel's residuals (<= r + delta)
    angles = certify(th, r + delta, k, lambda a, b: block_res(a, b) + delta, **kw)
    scale = np.abs(th)
    with np.errstate(divide="ignore", invalid="ignore"):
        eig_b = np.asarray(cert["eigenvalue_bounds"], dtype=float) + delta / scale
    levels = np.asarray(cert["eigenvalue_levels"], dtype=float)
    eig_ok = eig_b * scale <= levels * scale + floor
    vec_ok = np.asarray(angles["vector_ok"], dtype=bool)
    cert.update(
        eigenvalue_bounds=[float(x) for x in eig_b],
        eigenvalue_ok=eig_ok.tolist(),
        angle_bounds=list(angles["angle_bounds"]),
        vector_ok=vec_ok.tolist(),
        ok=bool(eig_ok.all() and vec_ok.all()),
        block_rounding=delta,
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        residuals = (r + delta) / np.abs(th)
    return {
        "eigenvalues": th,
        "eigenvectors": deterministic_signs(Vr),
        "residuals": residuals,
        "row_means": mu,
        "grand_mean": g,
        "certificate": cert,
        "delta": delta,
        "seconds": seconds,
    }


def _block_norms(R: np.ndarray) -> Any:
    """``(a, b) -> ||R[:, a:b]||_2`` from the k x k Gram matrix of ``R`` (one n k^2
    product instead of an n x (b - a) SVD per call; certify calls it twice per cluster)."""
    G = R.T @ R

    def norm(a: int, b: int) -> float:
        if b <= a:
            return 0.0
        return float(np.sqrt(max(float(np.linalg.eigvalsh(G[a:b, a:b])[-1]), 0.0)))

    return norm


def _orthonormal(V: np.ndarray) -> np.ndarray:
    """``V`` itself when its columns are orthonormal to rounding (the solver's last-pass
    vectors are), else an orthonormal basis of its span (QR): the bounds of
    :func:`recertify` take ``V`` orthonormal."""
    k = V.shape[1]
    if k and np.linalg.norm(V.T @ V - np.eye(k), 2) > 1e-10:
        return np.linalg.qr(V)[0]
    return V
