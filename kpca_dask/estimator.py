"""``KernelPCA``: scikit-learn's estimator contract on top of the dask solvers."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin

from . import _validation as V
from ._threads import blas_threads_for_dask
from .centering import CentredKernel
from .exceptions import InvalidInputError, InvalidParameterError, NotFittedError
from .gram import BlockKernelMatrix, cross_products
from .kernels import Kernel, make_kernel
from .solvers import EigResult, dense_eigh, drop_nonpositive, randomized_eigh
from .solvers.dense import centre_inplace

__all__ = ["KernelPCA"]

logger = logging.getLogger("kpca_dask")

#: Below this many samples "auto" uses the dense solver (measured crossover,
#: see benchmarks/bench_exact.py: at n = 2000 eigh takes ~0.5 s and a
#: randomized solve ~0.3 s; dense memory grows as 8 n^2 bytes).
DENSE_MAX_SAMPLES = 2000

_KERNEL_NAMES = ("linear", "poly", "polynomial", "rbf", "laplacian", "sigmoid", "cosine")


def _auto_block_rows(n: int, target: int = 2048, min_rows: int = 256) -> int:
    """Rows per block: about 2048 (a 16-32 MB block, tens of ms of work per
    task), and at least 6 row blocks (21 upper-block tasks) when n allows, so
    that the tasks of a pass balance over the cores."""
    nb = max(1, math.ceil(n / target))
    if nb < 6:
        nb = max(nb, min(6, n // min_rows))
    return int(math.ceil(n / nb))


class KernelPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Kernel principal component analysis on Dask, exact or randomized.

    Conventions match :class:`sklearn.decomposition.KernelPCA`: the kernel
    matrix is centred in feature space, ``eigenvalues_`` are those of the
    centred kernel matrix (not divided by n), and the training embedding is
    ``eigenvectors_ * sqrt(eigenvalues_)``. The kernel matrix is never formed
    by the randomized solver: products with it are computed block by block on
    whatever Dask scheduler is active (threaded, a LocalCluster, a remote
    cluster), reading each upper block once per pass.

    Parameters
    ----------
    n_components : int or None, default=None
        Number of components. None keeps all components with positive
        eigenvalues (dense solver only).
    kernel : {"linear", "poly", "rbf", "laplacian", "sigmoid", "cosine"} or callable, default="linear"
        A callable is called as ``kernel(A, B, **kernel_params)`` on two float64
        numpy blocks of rows and must return the ``(len(A), len(B))`` block.
    gamma : float, "scale" or None, default=None
        Kernel coefficient of rbf, laplacian, poly and sigmoid. None means
        ``1 / n_features``; "scale" is the median heuristic on a sample of at
        most 1000 rows: ``1 / (2 median |x - y|^2)`` for rbf, ``1 / median
        |x - y|_1`` for laplacian, ``1 / median |x . y|`` for poly and sigmoid.
        The value used is ``gamma_``.
    degree : float, default=3
        Degree of the polynomial kernel.
    coef0 : float, default=1
        Independent term of the poly and sigmoid kernels.
    kernel_params : dict or None, default=None
        Keyword arguments of a callable kernel (refused for named kernels:
        use gamma/degree/coef0).
    eigen_solver : {"auto", "dense", "randomized"}, default="auto"
        "dense" forms the n x n matrix and calls ``scipy.linalg.eigh``;
        "randomized" never forms it (block Krylov or subspace iteration on
        the implicit centred matrix, Nyström finish); "auto" uses dense up to
        2000 samples or when the requested block is at least half of n.
    n_oversamples : int, default=24
        Extra columns of the randomized block (``l = n_components + n_oversamples``).
        Larger blocks converge in fewer passes; each pass costs a kernel
        evaluation plus GEMMs linear in ``l`` (24 was fastest for 16 components
        in benchmarks/bench_exact.py).
    n_power_iter : int or "auto", default="auto"
        Randomized passes after the first; "auto" stops when the leading
        eigenvalues change by less than ``tol`` between passes.
    tol : float or None, default=None
        Relative change that counts as converged for ``n_power_iter="auto"``;
        None means 1e-8 for float64 and 1e-5 for float32 kernel evaluation.
    max_iter : int, default=20
        Cap on randomized passes with ``n_power_iter="auto"``.
    randomized_method : {"block_krylov", "subspace"}, default="block_krylov"
        Block Krylov keeps every block (fewest passes, memory ``2 n l passes``
        floats on the driver); subspace iteration keeps one (``2 n l``).
    random_state : int, RandomState, Generator or None, default=None
        Seeds the randomized test matrix (drawn from the seed alone, not
        from the chunking) and the "scale" sample.
    dtype : {"float64", "float32"}, default="float64"
        Precision of kernel evaluation and in-block products; float32 is
        2-3x faster for rbf-type kernels, with eigenvalues typically within
        1e-7 relative. Embeddings are returned in this dtype; eigenvalues are
        always float64.
    chunk_size : int or "auto", default="auto"
        Rows per block of the kernel partition (and per transform task).
        Per-task memory grows as ``chunk_size * (n_features + strip)``; the
        number of kernel tasks per pass as ``(n / chunk_size)^2 / 2``.

    Attributes
    ----------
    eigenvalues_ : ndarray of shape (n_components_,)
        Eigenvalues of the centred kernel matrix, descending.
    eigenvectors_ : ndarray of shape (n_samples, n_components_)
        Orthonormal eigenvectors, each with its largest-magnitude entry positive.
    explained_variance_ratio_ : ndarray of shape (n_components_,)
        ``eigenvalues_ / trace(Kc)`` with ``trace(Kc) = trace(K) - n g``.
    residuals_ : ndarray of shape (n_components_,)
        ``||Kc v - lambda v|| / lambda`` per returned pair, from a real product:
        an a-posteriori accuracy certificate.
    row_means_ : ndarray of shape (n_samples,)
        Row means ``mu`` of the uncentred training kernel matrix.
    grand_mean_ : float
        Grand mean ``g`` of the training kernel matrix.
    X_fit_ : ndarray of shape (n_samples, n_features)
        Training rows (a copy: later changes to the source do not affect the model).
    gamma_ : float or None
        The kernel coefficient used.
    n_components_ : int
        Components kept (those with positive eigenvalues).
    n_features_in_ : int
    eigen_solver_ : str
        Solver actually used.
    n_passes_ : int
        Passes over the kernel blocks the fit made.
    converged_ : bool

    Examples
    --------
    >>> import numpy as np
    >>> from kpca_dask import KernelPCA
    >>> X = np.random.default_rng(0).normal(size=(500, 3))
    >>> kpca = KernelPCA(n_components=2, kernel="rbf", gamma=0.5).fit(X)
    >>> kpca.transform(X[:4]).shape
    (4, 2)
    """

    def __init__(
        self,
        n_components: int | None = None,
        *,
        kernel: Any = "linear",
        gamma: Any = None,
        degree: float = 3,
        coef0: float = 1,
        kernel_params: dict | None = None,
        eigen_solver: str = "auto",
        n_oversamples: int = 24,
        n_power_iter: Any = "auto",
        tol: float | None = None,
        max_iter: int = 20,
        randomized_method: str = "block_krylov",
        random_state: Any = None,
        dtype: Any = "float64",
        chunk_size: Any = "auto",
    ):
        self.n_components = n_components
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.kernel_params = kernel_params
        self.eigen_solver = eigen_solver
        self.n_oversamples = n_oversamples
        self.n_power_iter = n_power_iter
        self.tol = tol
        self.max_iter = max_iter
        self.randomized_method = randomized_method
        self.random_state = random_state
        self.dtype = dtype
        self.chunk_size = chunk_size

    # ------------------------------------------------------------------ params
    def _check_params(self) -> None:
        V.validate_params(
            "KernelPCA",
            self.get_params(deep=False),
            {
                "n_components": [V.int_range(1), V.Rule("None", lambda v: v is None)],
                "kernel": [V.options(*_KERNEL_NAMES), V.Rule("a callable", callable)],
                "gamma": [V.real_range(0, lo_open=True, allow=("scale",)),
                          V.Rule("None", lambda v: v is None)],
                "degree": V.real_range(0, lo_open=True),
                "coef0": V.real_range(-np.inf),
                "kernel_params": [V.Rule("a dict", lambda v: isinstance(v, dict)),
                                  V.Rule("None", lambda v: v is None)],
                "eigen_solver": V.options("auto", "dense", "randomized"),
                "n_oversamples": V.int_range(0),
                "n_power_iter": V.int_range(0, allow=("auto",)),
                "tol": [V.real_range(0, lo_open=True), V.Rule("None", lambda v: v is None)],
                "max_iter": V.int_range(1),
                "randomized_method": V.options("block_krylov", "subspace"),
                "chunk_size": V.int_range(1, allow=("auto",)),
            },
        )
        V.resolve_dtype(self.dtype)
        if self.kernel_params is not None and not callable(self.kernel):
            raise InvalidParameterError(
                f"kernel_params is only used with a callable kernel; for kernel="
                f"{self.kernel!r} pass gamma, degree and coef0 directly."
            )

    # ----------------------------------------------------------------- fitting
    def fit(self, X: Any, y: Any = None, *, kernel_blocks: Any = None,
            centring: tuple[np.ndarray, float] | None = None) -> KernelPCA:
        """Fit the model on ``X`` (numpy, dask or zarr array of shape (n_samples, n_features)).

        Parameters
        ----------
        X : array of shape (n_samples, n_features)
        y : ignored
        kernel_blocks : callable ``(i, j) -> ndarray``, optional
            Reader of a materialised kernel matrix: returns the stored upper
            block ``K_ij`` (``i <= j``) of the partition into ``chunk_size``
            rows (``chunk_size`` must then be an int). Products read these
            blocks instead of evaluating the kernel (exact solvers only).
        centring : (row_means, grand_mean), optional
            Precomputed centring statistics of the training kernel matrix
            (e.g. from a distributed reduction over stored blocks); the first
            pass then does not compute them.
        """
        self._fit(X, kernel_blocks=kernel_blocks, centring=centring)
        return self

    def fit_transform(self, X: Any, y: Any = None, **params: Any) -> Any:
        """Fit and return the training embedding ``eigenvectors_ * sqrt(eigenvalues_)``."""
        Xd, kind = self._fit(X, **params)
        emb = (self.eigenvectors_ * np.sqrt(self.eigenvalues_)).astype(self._dtype, copy=False)
        if kind == "numpy":
            return emb
        return da.from_array(emb, chunks=(Xd.chunks[0], (emb.shape[1],)))

    def _fit(self, X: Any, kernel_blocks: Any = None,
             centring: tuple[np.ndarray, float] | None = None) -> tuple[da.Array, str]:
        t0 = time.perf_counter()
        self._check_params()
        self._dtype = V.resolve_dtype(self.dtype)
        Xd, kind = V.as_dask_array(X)
        n, d = (int(s) for s in Xd.shape)
        if self.n_components is not None:
            V.check_n_components(self.n_components, n)
        V.check_finite(Xd)
        self.n_features_in_ = d
        r = _auto_block_rows(n) if self.chunk_size == "auto" else min(int(self.chunk_size), n)
        self.chunk_size_ = r
        Xb = Xd.rechunk({0: r, 1: -1})
        if Xb is not Xd:
            Xb = Xb.persist()

        self.gamma_ = self._resolve_gamma(Xb, n, d)
        self.kernel_ = self._make_kernel()
        solver = self._resolve_solver(n)
        self.eigen_solver_ = solver
        logger.info("KernelPCA fit: n=%d, d=%d, kernel=%s, solver=%s, %d blocks of %d rows, %s",
                    n, d, self.kernel_, solver, len(Xb.chunks[0]), r, self._dtype.name)

        if kernel_blocks is not None and self.chunk_size == "auto":
            raise InvalidParameterError(
                "kernel_blocks needs an explicit integer chunk_size: the row blocks of the "
                "stored kernel matrix."
            )
        K = BlockKernelMatrix(Xb, self.kernel_, self._dtype, block_reader=kernel_blocks)
        with blas_threads_for_dask():
            trace_K, X_np = dask.compute(K.diag().sum(), Xb)
        self.X_fit_ = np.asarray(X_np, dtype=np.float64)
        if solver == "dense":
            res, mu, g = self._solve_dense(K)
        else:
            res, mu, g = self._solve_randomized(K, n, centring)

        k_req = res.eigenvalues.shape[0]
        rtol = 1e-12 if self._dtype == np.float64 else 1e-6
        w, vecs, resid = drop_nonpositive(res.eigenvalues, res.eigenvectors, res.residuals,
                                          rtol=rtol, requested=k_req)
        self.eigenvalues_ = w
        self.eigenvectors_ = np.ascontiguousarray(vecs)  # layout-independent sums: bitwise reload
        self.residuals_ = resid
        self.row_means_ = mu
        self.grand_mean_ = g
        self.kernel_trace_ = float(trace_K)
        self.centred_trace_ = float(trace_K) - n * g
        self.explained_variance_ratio_ = w / self.centred_trace_
        self.n_components_ = int(w.shape[0])
        self.n_passes_ = res.n_passes
        self.converged_ = res.converged
        self.solver_info_ = res.info
        self._coef_cache = None
        self.fit_seconds_ = time.perf_counter() - t0
        logger.info("KernelPCA fit done in %.2f s: %d components, %d passes, max residual %.2e",
                    self.fit_seconds_, self.n_components_, self.n_passes_,
                    float(np.max(resid)) if resid.size else 0.0)
        return Xd, kind

    def _resolve_gamma(self, Xb: da.Array, n: int, d: int) -> float | None:
        name = "callable" if callable(self.kernel) else self.kernel
        if name not in ("rbf", "laplacian", "poly", "polynomial", "sigmoid"):
            return None
        if self.gamma is None:
            return 1.0 / d
        if isinstance(self.gamma, str):  # "scale": median heuristic on a sample
            rng = np.random.default_rng(self.random_state if isinstance(self.random_state, int) else 0)
            m = min(n, 1000)
            idx = np.sort(rng.choice(n, size=m, replace=False))
            S = np.asarray(Xb[idx].compute(), dtype=np.float64)
            iu = np.triu_indices(m, 1)
            if name == "rbf":
                sq = np.einsum("ij,ij->i", S, S)
                stat = np.maximum(sq[:, None] + sq[None, :] - 2 * S @ S.T, 0)[iu]
                med, factor = np.median(stat), 2.0
            elif name == "laplacian":
                from scipy.spatial.distance import pdist
                med, factor = np.median(pdist(S, "cityblock")), 1.0
            else:
                med, factor = np.median(np.abs(S @ S.T)[iu]), 1.0
            if not med > 0:
                raise InvalidInputError(
                    "gamma='scale' needs distinct rows: the median pairwise statistic of a "
                    "sample of X is 0 (mostly duplicate or zero rows). Pass a numeric gamma."
                )
            return float(1.0 / (factor * med))
        return float(self.gamma)

    def _make_kernel(self) -> Kernel:
        return make_kernel(self.kernel, gamma=self.gamma_, degree=self.degree, coef0=self.coef0,
                           kernel_params=self.kernel_params)

    def _resolve_solver(self, n: int) -> str:
        solver = self.eigen_solver
        if self.n_components is None:
            if solver == "randomized":
                raise InvalidParameterError(
                    "eigen_solver='randomized' needs an explicit n_components "
                    "(None means all components, which only the dense solver computes)."
                )
            return "dense"
        if solver == "auto":
            l = self.n_components + self.n_oversamples
            solver = "dense" if (n <= DENSE_MAX_SAMPLES or 2 * l >= n) else "randomized"
        if solver == "randomized" and self.n_components >= n:
            raise InvalidParameterError(
                f"eigen_solver='randomized' needs n_components < n_samples (got "
                f"{self.n_components} for {n} samples); use eigen_solver='dense'."
            )
        return solver

    def _solve_dense(self, K: BlockKernelMatrix) -> tuple[EigResult, np.ndarray, float]:
        n = K.n
        if n > 20000:
            logger.warning("dense solver on n=%d forms a %.1f GB matrix; consider "
                           "eigen_solver='randomized'", n, 8 * n * n / 1e9)
        with blas_threads_for_dask():
            Km = K.to_numpy().astype(np.float64, copy=False)
        mu, g = centre_inplace(Km)
        k = n if self.n_components is None else self.n_components
        res = dense_eigh(Km, k)
        return res, mu, g

    def _solve_randomized(self, K: BlockKernelMatrix, n: int,
                          centring: tuple[np.ndarray, float] | None = None
                          ) -> tuple[EigResult, np.ndarray, float]:
        op = CentredKernel(K)
        if centring is not None:
            mu, g = centring
            op.row_means, op.grand_mean = np.asarray(mu, dtype=np.float64), float(g)
        tol = self.tol
        if tol is None:
            tol = 1e-8 if self._dtype == np.float64 else 1e-5
        res = randomized_eigh(
            op,
            self.n_components,
            n_oversamples=self.n_oversamples,
            n_power_iter=self.n_power_iter,
            method=self.randomized_method,
            tol=tol,
            max_passes=self.max_iter,
            psd=self.kernel_.psd,
            eps=float(np.finfo(self._dtype).eps),
            random_state=self.random_state,
        )
        res.info["pass_seconds"] = list(op.pass_seconds)
        return res, op.row_means, float(op.grand_mean)

    # --------------------------------------------------------------- transform
    def _check_fitted(self) -> None:
        if not hasattr(self, "eigenvectors_"):
            raise NotFittedError(
                "This KernelPCA instance is not fitted yet. Call 'fit' with appropriate "
                "arguments before using this estimator."
            )

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "eigenvectors_")

    @property
    def _n_features_out(self) -> int:
        return self.n_components_

    def _coefficients(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        """``[A, 1]`` with ``A = V / sqrt(lambda)`` plus ``mu^T A``, ``1^T A`` and a token."""
        cache = getattr(self, "_coef_cache", None)
        if cache is None:
            A = self.eigenvectors_ / np.sqrt(self.eigenvalues_)
            A_aug = np.hstack([A, np.ones((A.shape[0], 1))])
            token = tokenize(self.X_fit_, A_aug, self.kernel_, str(self._dtype))
            cache = (A_aug, self.row_means_ @ A, A.sum(axis=0), token)
            self._coef_cache = cache
        return cache

    def _project(self, X: Any, what: str) -> Any:
        self._check_fitted()
        Xd, kind = V.as_dask_array(X)
        if Xd.shape[1] != self.n_features_in_:
            raise InvalidInputError(
                f"X has {Xd.shape[1]} features, but KernelPCA was fitted with "
                f"{self.n_features_in_} features; pass data with the same columns as in fit."
            )
        V.check_finite(Xd)
        A_aug, muA, oneA, token = self._coefficients()
        k = self.n_components_
        out_cols = k if what == "transform" else 1
        Xr = Xd.rechunk({0: self.chunk_size_, 1: -1})
        name = f"kpca-{what}-" + tokenize(token, Xr.name)
        train_key, coef_key = "kpca-train-" + token, "kpca-coef-" + token
        dsk: dict[Any, Any] = {train_key: self.X_fit_, coef_key: A_aug}
        consts = (muA, oneA, float(self.grand_mean_), self.X_fit_.shape[0])
        for b in range(len(Xr.chunks[0])):
            dsk[(name, b, 0)] = (_project_block, (Xr.name, b, 0), train_key, coef_key, consts,
                                 self.kernel_, self._dtype.str, what)
        graph = HighLevelGraph.from_collections(name, dsk, dependencies=[Xr])
        out_dtype = self._dtype if what == "transform" else np.float64
        out = da.Array(graph, name, chunks=(Xr.chunks[0], (out_cols,)), dtype=out_dtype)
        if kind == "numpy":
            with blas_threads_for_dask():
                (res,) = dask.compute(out)
            return res if what == "transform" else res[:, 0]
        out = out.rechunk({0: Xd.chunks[0]})
        return out if what == "transform" else out[:, 0]

    def transform(self, X: Any) -> Any:
        """Embed ``X``: numpy in, numpy out; dask or zarr in, lazy dask array out.

        Costs ``n_samples_fit`` kernel evaluations per row; a new row ``x`` is
        centred with the training statistics (``k(x, X) - mu - mean + g``).
        """
        return self._project(X, "transform")

    def score_samples(self, X: Any) -> Any:
        """Reconstruction error in feature space of each row (a novelty score).

        ``||phi_c(x)||^2 - sum_k emb_k(x)^2`` with
        ``||phi_c(x)||^2 = k(x, x) - 2 mean(k(x, X)) + g`` (Hoffmann 2007).
        Larger means farther from the principal subspace.
        """
        return self._project(X, "score")

    # ------------------------------------------------------------ persistence
    def save(self, path: Any, *, overwrite: bool = False) -> None:
        """Save the fitted model as a zarr group (arrays + JSON, no pickle)."""
        from .persistence import save_model

        save_model(self, path, overwrite=overwrite)


def _project_block(xb, X_fit, A_aug, consts, kernel, dtype, what):
    muA, oneA, g, n = consts
    P = cross_products(kernel, xb, X_fit, A_aug, dtype)
    k = A_aug.shape[1] - 1
    s = P[:, k] / n  # mean(k(x, X)) per new row
    emb = P[:, :k] - muA[None, :] - s[:, None] * oneA[None, :] + g * oneA[None, :]
    if what == "transform":
        return emb.astype(dtype, copy=False)
    norm2 = kernel.diag(xb, np.float64) - 2.0 * s + g
    return (norm2 - np.einsum("ij,ij->i", emb, emb))[:, None]
