"""Pre-images: from kernel PCA embeddings back to input space (denoising).

A point ``x`` embeds as ``z`` (k numbers); its reconstruction in feature space
is the projection of ``phi(x)`` on the leading components plus the mean,

    P phi(x) = mu_phi + sum_k z_k u_k = sum_i gamma_i(z) phi(p_i),
    gamma(z) = b + B z,

an expansion over the model's *expansion points* ``p_i`` (:func:`expansion`).
There is usually no input ``x'`` with ``phi(x') = P phi(x)``; three ways to
approximate one (docs/denoise.md, with the sources):

``"learned"`` (Bakır, Weston and Schölkopf 2004)
    Kernel ridge regression from embeddings back to inputs, trained on s rows
    (their embedding ``E``, s x k, and the rows ``X_s``, s x d): ``dual = (k(E,
    E) + alpha I)^-1 X_s`` and ``x'(z) = k(z, E) @ dual``, with the model's own
    kernel and gamma on the embedding space (scikit-learn's
    ``KernelPCA(fit_inverse_transform=True)`` exactly; it does not add the
    mean back explicitly). Fit: one s x s solve; per row: ``s (k + d)``.
``"fixed_point"`` (rbf only; Mika, Schölkopf, Smola et al. 1999)
    Maximise ``<P phi(x), phi(x')>`` by iterating ``x' <- sum_i w_i p_i / sum_i
    w_i`` with ``w_i = gamma_i(z) k(x', p_i)``, started from the learned
    pre-image. Per row and iteration: ``n_points (k + d)``.
``"exact"`` (linear kernel only)
    ``phi`` is the identity, so the pre-image exists: ``x' = sum_i gamma_i p_i
    = mean + z @ components`` with ``mean = P^T b`` and ``components = B^T P``
    (k x d): linear PCA's reconstruction. Per row: ``k d``.

Expansion coefficients (maintenance note: derive, do not guess, the centring
terms). Exact solvers, ``A = V / sqrt(lambda)`` on the n training rows:
``u_k = sum_i A_ik (phi(x_i) - mu_phi)`` and ``mu_phi = sum_i phi(x_i) / n``,
so ``b = 1 / n`` and ``B = A - 1 (1^T A) / n`` (A with its columns centred).
Nyström, ``A = projection_`` on the m landmarks: ``u_k = sum_j A_jk
phi(z_j)`` (orthonormal: ``A = T P_k`` with ``T`` whitening the landmarks'
features) and the mean is replaced by its projection on the landmarks' span,
``W^+ c`` (``mean_weights_``, as in ``score_samples``): ``b = mean_weights_``,
``B = A``. With all rows as landmarks both give the same expansion.

Fixed point, numerics: the update is a ratio of sums of ``gamma_i
k(x', p_i)``, invariant to a common factor, so each row's kernel values are
scaled by ``exp(gamma min_i |x' - p_i|^2)`` (log-sum-exp style, streamed over
strips of expansion points): nothing underflows when ``x'`` is far from every
point. A row fails when its denominator is not clearly positive (``<=``
``DENOMINATOR_RTOL`` times the sum of the absolute terms: the projection is
nearly orthogonal to ``phi(x')``, the update is undefined or points away from
the data), when the iterate leaves the data (``DIVERGENCE_FACTOR`` data scales
from the points' mean) or is not finite, or when it has not converged after
``max_iter`` iterations. Failed rows get the learned pre-image, and the caller
is told how many (:class:`~kpca_dask.exceptions.PreimageConvergenceWarning`).

Memory model: a block task holds its rows (r x k and r x d), the constants
(expansion points and coefficients, the learned map's s x k and s x d arrays)
and one ``r x strip`` block of kernel values; nothing of size n x n or r x n.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from . import exceptions as _exc
from .exceptions import InvalidInputError
from .gram import cross_products
from .kernels import Kernel
from .params import PREIMAGE_METHODS

__all__ = [
    "PREIMAGE_METHODS",
    "DEFAULT_PREIMAGE_SAMPLE_SIZE",
    "Expansion",
    "exact_expansion",
    "nystroem_expansion",
    "linear_preimage_basis",
    "fit_learned_preimage",
    "sample_indices",
    "fixed_point_preimage",
    "preimage_block",
    "STATUS_CONVERGED",
    "STATUS_MAX_ITER",
    "STATUS_DIVERGED",
    "warn_not_converged",
]


#: Rows the learned pre-image is trained on when ``preimage_sample_size="auto"``
#: and the model is exact (Nyström models use their landmarks): a cheap solve
#: (docs/nystroem.md, tuning constants), and every row up to this many training
#: rows is used, so small fits agree with scikit-learn.
DEFAULT_PREIMAGE_SAMPLE_SIZE = 2048

#: A fixed-point denominator ``sum_i gamma_i k(x', p_i)`` at or below this
#: fraction of ``sum_i |gamma_i| k(x', p_i)`` counts as vanished.
DENOMINATOR_RTOL = 1e-8

#: An iterate farther than this many data scales from the points' mean has diverged.
DIVERGENCE_FACTOR = 100.0

STATUS_CONVERGED, STATUS_MAX_ITER, STATUS_DIVERGED = 0, 1, 2

#: Expansion points per strip of kernel values in the fixed-point iteration.
_STRIP = 2048


@dataclass(frozen=True)
class Expansion:
    """``P phi(x) = sum_i (b + B z)_i phi(points_i)`` for an embedding ``z``.

    Attributes
    ----------
    points : ndarray of shape (n_points, n_features)
    b : ndarray of shape (n_points,)
    B : ndarray of shape (n_points, n_components)
    """

    points: np.ndarray
    b: np.ndarray
    B: np.ndarray

    def scale(self) -> tuple[np.ndarray, float]:
        """The points' mean and root mean squared distance to it (the data scale)."""
        centre = self.points.mean(axis=0)
        s = float(np.sqrt(np.mean(np.sum((self.points - centre) ** 2, axis=1))))
        return centre, s if s > 0 else 1.0


def exact_expansion(
    X_fit: np.ndarray, eigenvectors: np.ndarray, eigenvalues: np.ndarray
) -> Expansion:
    """Expansion over the n training rows of an exact model (see the module notes)."""
    n = X_fit.shape[0]
    from ._eigvals import inv_sqrt

    A = eigenvectors * inv_sqrt(eigenvalues)  # zero components contribute nothing
    B = A - A.mean(axis=0)
    return Expansion(np.asarray(X_fit, dtype=np.float64), np.full(n, 1.0 / n), B)


def nystroem_expansion(
    landmarks: np.ndarray, projection: np.ndarray, mean_weights: np.ndarray
) -> Expansion:
    """Expansion over the m landmarks of a Nyström model (see the module notes)."""
    return Expansion(
        np.asarray(landmarks, dtype=np.float64),
        np.asarray(mean_weights, dtype=np.float64),
        np.asarray(projection, dtype=np.float64),
    )


def linear_preimage_basis(exp: Expansion) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, components)`` with ``x' = mean + z @ components`` for a linear kernel.

    ``mean = points^T b`` (d,), ``components = B^T points`` (k x d). For an
    exact model these are the training mean and linear PCA's components.
    """
    return exp.points.T @ exp.b, np.ascontiguousarray(exp.B.T @ exp.points)


def sample_indices(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` distinct rows of ``range(n)``, uniform, sorted (all rows if size >= n)."""
    if size >= n:
        return np.arange(n, dtype=np.int64)
    return np.sort(rng.choice(n, size=size, replace=False)).astype(np.int64)


def fit_learned_preimage(
    kernel: Kernel, embedding: np.ndarray, rows: np.ndarray, alpha: float
) -> np.ndarray:
    """Dual coefficients ``(k(E, E) + alpha I)^-1 X_s`` of the learned pre-image (s x d).

    As scikit-learn: a Cholesky solve (``assume_a="pos"``). When ``k(E, E) +
    alpha I`` is not positive definite (``alpha=0`` on duplicate embeddings,
    or an indefinite kernel) the minimum-norm least-squares solution is used.
    Memory: one s x s float64 matrix.
    """
    E = np.ascontiguousarray(embedding, dtype=np.float64)
    K = np.asarray(kernel(E, E, dtype=np.float64), dtype=np.float64)
    K = (K + K.T) / 2
    K.flat[:: K.shape[0] + 1] += alpha
    X = np.asarray(rows, dtype=np.float64)
    try:
        return scipy.linalg.solve(K, X, assume_a="pos", check_finite=False)
    except (np.linalg.LinAlgError, scipy.linalg.LinAlgError):
        return scipy.linalg.lstsq(K, X, check_finite=False)[0]


def _weighted_sums(
    x: np.ndarray, z: np.ndarray, exp: Expansion, pts_sq: np.ndarray, gamma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sum_i w_i p_i, sum_i w_i, sum_i |w_i|)`` with ``w_i = (b + B z)_i k(x, p_i)``,
    all scaled by ``exp(gamma min_i |x - p_i|^2)`` per row (streamed over strips)."""
    r, d = x.shape
    x_sq = np.einsum("ij,ij->i", x, x)
    num = np.zeros((r, d))
    den = np.zeros(r)
    absden = np.zeros(r)
    top = np.full(r, -np.inf)
    for j0 in range(0, exp.points.shape[0], _STRIP):
        j1 = min(j0 + _STRIP, exp.points.shape[0])
        P = exp.points[j0:j1]
        logk = x @ P.T
        logk *= 2.0
        logk -= x_sq[:, None]
        logk -= pts_sq[None, j0:j1]
        np.minimum(logk, 0.0, out=logk)  # -|x - p|^2, rounding clipped
        logk *= gamma
        new_top = np.maximum(top, logk.max(axis=1))
        rescale = np.exp(top - new_top)  # 0 on the first strip (accumulators are 0)
        num *= rescale[:, None]
        den *= rescale
        absden *= rescale
        logk -= new_top[:, None]
        W = np.exp(logk, out=logk)
        W *= exp.b[None, j0:j1] + z @ exp.B[j0:j1].T
        num += W @ P
        den += W.sum(axis=1)
        absden += np.abs(W).sum(axis=1)
        top = new_top
    return num, den, absden


def fixed_point_preimage(
    z: np.ndarray,
    x0: np.ndarray,
    exp: Expansion,
    gamma: float,
    tol: float,
    max_iter: int,
    scale: tuple[np.ndarray, float] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mika et al.'s fixed-point pre-images of the rows of ``z`` (rbf kernel).

    Parameters
    ----------
    z : ndarray of shape (r, n_components)
        Embeddings.
    x0 : ndarray of shape (r, n_features)
        Starting points (the learned pre-images).
    exp : Expansion
    gamma : float
        The rbf kernel's coefficient.
    tol : float
        A row has converged when an update moves it by at most ``tol`` times
        the data scale (root mean squared distance of the points to their mean).
    max_iter : int
        Iteration cap.
    scale : (mean, data scale), optional
        Precomputed :meth:`Expansion.scale`.

    Returns
    -------
    x : ndarray of shape (r, n_features)
        The fixed points; rows that did not converge hold ``x0``.
    status : ndarray of shape (r,), int8
        ``STATUS_CONVERGED``, ``STATUS_MAX_ITER`` or ``STATUS_DIVERGED``.
    n_iter : ndarray of shape (r,), int32
        Iterations made per row.
    """
    z = np.asarray(z, dtype=np.float64)
    centre, s = exp.scale() if scale is None else scale
    # rbf is translation invariant: iterate on points and rows minus the points' mean, so
    # the expanded squared distances cancel within the data's spread, not its offset
    centre = np.asarray(centre, dtype=np.float64)
    x0 = np.asarray(x0, dtype=np.float64)
    exp = Expansion(exp.points - centre, exp.b, exp.B)
    x = x0 - centre
    r = x.shape[0]
    pts_sq = np.einsum("ij,ij->i", exp.points, exp.points)
    status = np.full(r, STATUS_MAX_ITER, dtype=np.int8)
    n_iter = np.zeros(r, dtype=np.int32)
    active = np.flatnonzero(np.isfinite(x).all(axis=1))
    status[np.setdiff1d(np.arange(r), active)] = STATUS_DIVERGED
    for _ in range(max_iter):
        if active.size == 0:
            break
        xa = x[active]
        num, den, absden = _weighted_sums(xa, z[active], exp, pts_sq, gamma)
        ok = den > DENOMINATOR_RTOL * absden
        with np.errstate(divide="ignore", invalid="ignore"):
            new = num / np.where(ok, den, 1.0)[:, None]
        ok &= np.isfinite(new).all(axis=1)
        ok &= np.linalg.norm(new, axis=1) <= DIVERGENCE_FACTOR * s
        step = np.linalg.norm(new - xa, axis=1)
        done = ok & (step <= tol * s)
        n_iter[active] += 1
        x[active[ok]] = new[ok]
        status[active[~ok]] = STATUS_DIVERGED
        status[active[done]] = STATUS_CONVERGED
        active = active[ok & ~done]
    x += centre
    failed = status != STATUS_CONVERGED
    x[failed] = x0[failed]
    return x, status, n_iter


def warn_not_converged(status: np.ndarray, max_iter: int) -> None:
    """One :class:`PreimageConvergenceWarning` counting the rows that fell back."""
    capped = int(np.count_nonzero(status == STATUS_MAX_ITER))
    diverged = int(np.count_nonzero(status == STATUS_DIVERGED))
    if capped or diverged:
        warnings.warn(
            f"The fixed-point pre-image did not converge for {capped + diverged} of "
            f"{status.size} rows ({capped} reached preimage_max_iter={max_iter}, {diverged} "
            "had a vanishing or negative denominator or diverged); those rows hold the "
            "learned pre-image instead. Raise preimage_max_iter or preimage_tol, or use "
            "preimage='learned'.",
            _exc.PreimageConvergenceWarning,
            stacklevel=3,
        )


def preimage_block(
    zb: np.ndarray, consts: dict[str, Any], method: str, warn: bool
) -> np.ndarray:
    """One row block of pre-images: ``(r, n_features + 1)`` float64, status in the last column.

    ``consts`` holds what the method needs: ``kernel``, ``embedding`` and
    ``dual_coef`` (learned, fixed_point), ``mean`` and ``components`` (exact),
    ``expansion``, ``scale``, ``tol`` and ``max_iter`` (fixed_point).
    """
    zb = np.asarray(zb, dtype=np.float64)
    if not np.isfinite(zb).all():
        raise InvalidInputError(
            "The embeddings passed to inverse_transform contain NaN or infinity; pass the "
            "output of transform (finite values)."
        )
    r = zb.shape[0]
    status = np.zeros(r, dtype=np.int8)
    if method == "exact":
        x = consts["mean"][None, :] + zb @ consts["components"]
    else:
        x = cross_products(
            consts["kernel"], zb, consts["embedding"], consts["dual_coef"], np.float64
        )
        if method == "fixed_point":
            x, status, _ = fixed_point_preimage(
                zb,
                x,
                consts["expansion"],
                consts["kernel"].gamma,
                consts["tol"],
                consts["max_iter"],
                consts["scale"],
            )
            if warn:
                warn_not_converged(status, consts["max_iter"])
    return np.hstack([x, status[:, None].astype(np.float64)])
