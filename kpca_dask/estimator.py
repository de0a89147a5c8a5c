"""``KernelPCA``: scikit-learn's estimator contract on top of the dask solvers."""

from __future__ import annotations

import logging
import math
import time
import warnings
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.metaestimators import available_if

from . import _validation as V
from ._threads import blas_threads_for_dask
from .centering import CentredKernel
from .exceptions import (ConvergenceWarning, InvalidInputError, InvalidParameterError,
                         NotFittedError)
from .gram import KERNEL_CACHE_MODES, BlockKernelMatrix, cross_products
from .kernels import Kernel, make_kernel
from ._eigvals import inv_sqrt, select_eigenpairs
from .gram import PrecomputedKernelMatrix
from .solvers import EigResult, dense_eigh, randomized_eigh
from .solvers.arpack import arpack_eigh
from .solvers.dense import centre_inplace
from .solvers.landmarks import LANDMARK_METHODS, select_landmarks
from .solvers.nystroem import choose_method, driver_blas, nystroem_basis, nystroem_eigh
from .solvers.randomized import _generator, escalation_plan, not_converged_message
from .preimage import (
    DEFAULT_PREIMAGE_SAMPLE_SIZE,
    PREIMAGE_METHODS,
    exact_expansion,
    fit_learned_preimage,
    linear_preimage_basis,
    nystroem_expansion,
    preimage_block,
    sample_indices,
    warn_not_converged,
)

__all__ = ["KernelPCA"]

logger = logging.getLogger("kpca_dask")

#: Below this many samples "auto" uses the dense solver (measured crossover,
#: see benchmarks/bench_exact.py: at n = 2000 eigh takes ~0.5 s and a
#: randomized solve ~0.3 s; dense memory grows as 8 n^2 bytes).
DENSE_MAX_SAMPLES = 2000

#: ``eigen_solver="auto"``: a randomized solve that is not certified falls back
#: to the dense solver up to this many samples (8 n^2 bytes: 0.2 GB), else it
#: retries with a larger block and more passes before it warns.
DENSE_FALLBACK_SAMPLES = 5000

#: Above this many samples "auto" uses the Nyström solver (with its default
#: number of landmarks). Measured crossover, see docs/nystroem.md and
#: ``benchmarks/bench_nystroem.py crossover``.
NYSTROEM_MIN_SAMPLES = 50_000

#: Largest n for which eigen_solver="arpack" with n_components >= n - 1 (which
#: ARPACK cannot do) forms the centred matrix and calls eigh, as scipy does.
ARPACK_FORMED_MAX_SAMPLES = DENSE_MAX_SAMPLES

#: Randomized and Nyström passes when ``max_iter=None`` (scikit-learn's default).
DEFAULT_MAX_ITER = 20

#: Landmarks used when ``n_landmarks=None``.
DEFAULT_N_LANDMARKS = 2048

#: Rows per block of the Nyström passes when ``chunk_size="auto"``: each task
#: computes ``rows x m`` kernel values in strips, so larger blocks only mean
#: fewer tasks (and fewer partial sums to add).
NYSTROEM_BLOCK_ROWS = 8192

#: Dask or zarr inputs up to this size are persisted (read once) by the
#: Nyström solver when they must be rechunked; larger ones are re-read from
#: their source at every pass, so memory stays at a few blocks.
NYSTROEM_PERSIST_BYTES = 256 << 20

#: Rules of the parameters scikit-learn's KernelPCA has and this estimator took over.
_SKLEARN_PARAM_RULES = {
    "remove_zero_eig": V.Rule("a bool", lambda v: isinstance(v, (bool, np.bool_))),
    "iterated_power": V.int_range(0, allow=("auto",)),
    "copy_X": V.Rule("a bool", lambda v: isinstance(v, (bool, np.bool_))),
    "n_jobs": [V.int_range(-1 << 30), V.Rule("None", lambda v: v is None)],
}

_KERNEL_NAMES = ("linear", "poly", "polynomial", "rbf", "laplacian", "sigmoid", "cosine")


def _gather_rows(X: da.Array, group_bytes: int = 64 << 20) -> np.ndarray:
    """``X`` as one float64 numpy array, filled a few row chunks at a time.

    ``dask.compute(X)`` holds every chunk on the workers and the driver until it
    concatenates them: for X of 0.82 GB (n = 100k, d = 1024) that was 1.9 GiB on the
    workers and 2.2 GiB on the driver at once. Here the driver holds the result
    and about ``group_bytes`` of chunks in flight (at least one chunk). With 256 MB
    groups the workers still rose by 0.45 GiB at n = 100k, d = 1024: the peak of the
    whole run.
    """
    import dask

    X = X.rechunk({1: -1})
    out = np.empty(X.shape, dtype=np.float64)
    blocks = X.to_delayed()[:, 0]
    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])])
    chunk_bytes = max(1, max(X.chunks[0]) * X.shape[1] * X.dtype.itemsize)
    step = max(1, group_bytes // chunk_bytes)
    for a in range(0, len(blocks), step):
        parts = dask.compute(*blocks[a:a + step])
        for b, part in enumerate(parts, start=a):
            out[offsets[b]:offsets[b + 1]] = part
        del parts
    return out


def _auto_block_rows(n: int, target: int = 2048, min_rows: int = 256) -> int:
    """Rows per block: about 2048 (a 16-32 MB block, tens of ms of work per
    task), and at least 6 row blocks (21 upper-block tasks) when n allows, so
    that the tasks of a pass balance over the cores."""
    nb = max(1, math.ceil(n / target))
    if nb < 6:
        nb = max(nb, min(6, n // min_rows))
    return int(math.ceil(n / nb))


class KernelPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Kernel principal component analysis on Dask: exact, randomized or Nyström.

    Conventions match :class:`sklearn.decomposition.KernelPCA`: the kernel
    matrix is centred in feature space, ``eigenvalues_`` are those of the
    centred kernel matrix (not divided by n), and the training embedding is
    ``eigenvectors_ * sqrt(eigenvalues_)`` (exact solvers). The kernel matrix
    is never formed by the randomized solver: products with it are computed
    block by block on whatever Dask scheduler is active (threaded, a
    LocalCluster, a remote cluster), reading each upper block once per pass.

    The Nyström solver (``eigen_solver="nystroem"``) costs time linear in n:
    it picks ``n_landmarks`` landmark rows Z, and computes the principal
    components of the centred Nyström features ``k(x, Z) W^-1/2`` with a few
    passes over X (see :mod:`kpca_dask.solvers.nystroem`). Its model keeps
    only the landmarks, an m x k projection and the centring vector, so a new
    row embeds in ``O(m d + m k)`` whatever n was. With ``n_landmarks >= n``
    (all rows are landmarks) it is exact kernel PCA.

    Parameters
    ----------
    n_components : int or None, default=None
        Number of components. None keeps all components with positive
        eigenvalues (dense and arpack solvers).
    kernel : {"linear", "poly", "rbf", "laplacian", "sigmoid", "cosine", "precomputed"} or callable, default="linear"
        A callable is called as ``kernel(A, B, **kernel_params)`` on two float64
        numpy blocks of rows and must return the ``(len(A), len(B))`` block; a
        callable written for scikit-learn (two 1-D rows in, a number out) is
        detected and called once per pair, as scikit-learn does (slow).
        "precomputed": ``fit`` takes the n x n kernel matrix (numpy, dask,
        zarr or scipy.sparse; read in square blocks, never copied whole; a
        matrix that is not exactly symmetric is used through its symmetric
        part) and ``transform`` the ``n_new x n`` kernel between new and
        training rows (docs/sklearn.md).
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
    eigen_solver : {"auto", "dense", "arpack", "randomized", "nystroem"}, default="auto"
        "dense" forms the n x n matrix and calls ``scipy.linalg.eigh``;
        "arpack" runs scipy's ``eigsh`` (Lanczos) on the implicit centred
        matrix, one pass over the kernel blocks per Lanczos step (tens to
        hundreds of passes: accurate, for small and medium n);
        "randomized" never forms it (block Krylov or subspace iteration on
        the implicit centred matrix, deflated for low-rank kernels, certified
        a posteriori: docs/solvers.md; when its block of ``n_components +
        n_oversamples`` columns covers all n samples it solves densely, and
        ``eigen_solver_`` says so); "nystroem" approximates
        kernel PCA with ``n_landmarks`` landmarks at a cost linear in n;
        "auto" uses dense up to 2000 samples or when the requested block is
        at least half of n, Nyström above 50 000 samples (measured crossover,
        docs/nystroem.md; not when ``kernel_blocks`` or ``centring`` are
        given), randomized in between; a randomized solve that "auto" chose
        and that is not certified falls back to dense up to 5000 samples,
        else is retried with a larger block before it warns.
    n_oversamples : int, default=24
        Extra columns of the randomized block (``l = n_components + n_oversamples``).
        Larger blocks converge in fewer passes; each pass costs a kernel
        evaluation plus GEMMs linear in ``l`` (24 was fastest for 16 components
        in benchmarks/bench_exact.py).
    n_power_iter : int or "auto", default="auto"
        Randomized passes after the first; "auto" stops as soon as the
        a-posteriori certificate holds (see ``tol``).
    tol : float or None, default=None
        Randomized solver: relative eigenvalue accuracy it certifies (and an
        angle of ``sqrt(tol)`` for each eigenvector, or for the invariant
        subspace of a cluster of nearly equal eigenvalues), up to the rounding
        level of the kernel products; None or 0 (scikit-learn's default) means
        1e-8 for float64 and 1e-5 for float32 kernel evaluation. "arpack":
        ARPACK's tolerance (None or 0: machine precision).
    max_iter : int or None, default=20
        Cap on randomized passes with ``n_power_iter="auto"`` (None: 20).
        "arpack": ARPACK's ``maxiter`` (None: ARPACK's default, ``10 n``).
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
        number of kernel tasks per pass as ``(n / chunk_size)^2 / 2``
        (Nyström: ``n / chunk_size``; "auto" is about 8192 rows there).
    n_landmarks : int or None, default=None
        Nyström only: number of landmarks m. None means ``min(n, 2048)``.
        Cost grows linearly in m (randomized method) or as m^2 (covariance
        method); accuracy improves with m (docs/nystroem.md).
    landmark_method : {"rpcholesky", "uniform", "kmeans++"}, default="rpcholesky"
        Nyström only: how landmarks are chosen. "uniform": distinct rows at
        random; "kmeans++": k-means++ seeding (input space) on a uniform
        sample; "rpcholesky": accelerated randomly pivoted Cholesky (Chen,
        Epperly, Tropp and Webber 2022; Epperly, Tropp and Webber 2024) on a
        uniform sample, which adapts to the kernel and does not miss small
        clusters. All depend on ``random_state`` only, not on the chunking.
    landmark_sample_size : int or "auto", default="auto"
        Nyström with kmeans++ or rpcholesky: rows of the uniform sample the
        landmarks are chosen from. "auto" is ``min(n, max(20000, 5 m))``;
        rpcholesky holds an ``s x m`` float64 factor (0.33 GB at 20480 x 2048).
    nystroem_method : {"auto", "randomized", "covariance"}, default="auto"
        Nyström only: how the top eigenpairs of the m x m feature covariance
        are found. "covariance" forms it in one pass (``n m^2`` flops);
        "randomized" runs block Krylov on it, one pass of ``4 n m l`` flops
        per product. "auto" picks the cheaper by a measured cost model
        (covariance below about 1700 landmarks for 64 features and 16
        components, and whenever ``n_components=None``).
    fit_inverse_transform : bool, default=False
        Also learn the pre-image map, so that :meth:`inverse_transform` maps
        embeddings back to input space (denoising: ``inverse_transform(
        transform(X))``). Costs one ``s x s`` solve at fit, ``s =
        preimage_sample_size_`` (never an n x n one).
    alpha : float, default=1.0
        Ridge term of the learned pre-image (kernel ridge regression from the
        embedding back to the input rows; scikit-learn's ``alpha``).
    preimage : {"auto", "learned", "fixed_point", "exact"}, default="auto"
        How :meth:`inverse_transform` finds pre-images (see
        :mod:`kpca_dask.preimage`). "learned": kernel ridge regression
        (Bakır, Weston and Schölkopf 2004), the same map as scikit-learn's
        (same kernel and gamma on the embedding space, no explicit mean).
        "fixed_point" (rbf only): the fixed-point iteration of Mika et al.
        (1999) on the model's expansion, started from the learned pre-image;
        rows that do not converge keep the learned one, with a
        :class:`~kpca_dask.exceptions.PreimageConvergenceWarning`. "exact"
        (linear kernel only): the pre-image exists, ``mean + z @
        preimage_components_``, i.e. linear PCA's reconstruction. "auto" is
        "exact" for the linear kernel and "learned" otherwise.
    preimage_sample_size : int or "auto", default="auto"
        Rows the learned pre-image is trained on (s). All training rows when
        ``s >= n_samples`` (then the learned map is scikit-learn's); otherwise
        ``s`` distinct rows drawn uniformly with ``random_state``. "auto":
        the landmarks for Nyström models, ``min(n_samples, 2048)`` rows for
        exact ones. Fit memory grows as ``8 s^2`` bytes, time as ``s^3 / 3``
        flops; each pre-image costs ``s (n_components + n_features)``.
    preimage_tol : float, default=1e-5
        Fixed point: a row has converged when an update moves it by at most
        ``preimage_tol`` times the data scale (root mean squared distance of
        the expansion points to their mean). Read by :meth:`inverse_transform`
        (it can be changed after fit).
    preimage_max_iter : int, default=100
        Fixed point: iteration cap per row (read by :meth:`inverse_transform`).
    remove_zero_eig : bool, default=False
        As scikit-learn: with an explicit ``n_components``, zero eigenvalues
        are kept as zero columns of the embedding unless this is True (then
        they are removed, with a
        :class:`~kpca_dask.exceptions.DroppedComponentsWarning`, and so are
        negative ones of a non-PSD kernel). ``n_components=None`` always
        removes them. Significantly negative eigenvalues among the requested
        ones are an error when False (scikit-learn's rule).
    iterated_power : int or "auto", default="auto"
        scikit-learn's name for ``n_power_iter`` (randomized passes after the
        first); when not "auto" it takes precedence. Set one of the two.
    copy_X : bool, default=True
        Accepted for scikit-learn compatibility; the training rows are always
        copied (``X_fit_`` is gathered from the row blocks), so later changes
        to ``X`` never change the model.
    n_jobs : int or None, default=None
        Accepted for scikit-learn compatibility and ignored: parallelism is the
        active Dask scheduler's (threads, a LocalCluster, a remote cluster).
    kernel_cache : {"auto", "memory", "recompute"}, default="auto"
        Exact solvers: where the kernel blocks come from at every pass after
        the first. "memory": evaluated once and kept in memory (the workers' on
        a cluster) until the fit ends; "recompute": evaluated again at every
        pass; "auto": "memory" when the upper blocks (``n^2 / 2`` values in
        ``dtype``) fit half of the workers' memory limits, or of the available
        RAM on the threaded scheduler (dask config ``kpca.kernel-cache-budget``
        overrides), else "recompute". The choice is in
        ``solver_info_["kernel_cache"]`` (docs/kernel-store.md).

    Attributes
    ----------
    eigenvalues_ : ndarray of shape (n_components_,)
        Eigenvalues of the centred kernel matrix, descending. Nyström: those
        of the centred feature covariance ``F_c^T F_c``, which approximate them.
    eigenvectors_ : ndarray of shape (n_fit_rows, n_components_)
        Coefficients of the components on the rows of ``X_fit_``, with
        ``transform(x) = (k(x, X_fit_) - row_means_) @ eigenvectors_ /
        sqrt(eigenvalues_)``. Exact solvers: the orthonormal eigenvectors of
        Kc (n_samples rows), each with its largest-magnitude entry positive.
        Nyström: ``projection_ * sqrt(eigenvalues_)`` on the m landmarks (the
        same sign rule); with all rows as landmarks these equal the exact
        eigenvectors, otherwise they are not orthonormal. The n x k
        eigenvectors of the Nyström approximation are never stored: they are
        ``fit_transform(X) / sqrt(eigenvalues_)``.
    explained_variance_ratio_ : ndarray of shape (n_components_,)
        ``eigenvalues_ / trace(Kc)`` with ``trace(Kc) = trace(K) - n g``
        (Nyström: trace(K) exact, g its Nyström estimate ``grand_mean_``).
    residuals_ : ndarray of shape (n_components_,)
        ``||Kc v - lambda v|| / lambda`` per returned pair, from a real product:
        an a-posteriori accuracy certificate. Nyström: ``||Sigma p - lambda p||
        / lambda`` for the m' x m' feature covariance Sigma (from a real pass
        for the randomized method, from the formed Sigma for the covariance
        method). It certifies the eigensolve of the Nyström problem, not how
        well Nyström approximates the exact kernel PCA.
    row_means_ : ndarray of shape (n_fit_rows,)
        Exact: row means ``mu = K 1 / n`` of the training kernel matrix.
        Nyström: ``mean_i k(x_i, z_j)`` at each landmark (exact, from a pass).
    grand_mean_ : float
        Grand mean ``g`` of the training kernel matrix (Nyström: its estimate
        ``c^T W^+ c``, the squared norm of the mean feature).
    X_fit_ : ndarray of shape (n_fit_rows, n_features)
        Rows the model keeps (copies): every training row for the exact
        solvers, the landmarks for Nyström.
    landmarks_, landmark_indices_, n_landmarks_ : Nyström only
        The landmark rows (same array as ``X_fit_``), their row indices in
        the training data (sorted) and their number m.
    projection_ : ndarray of shape (n_landmarks_, n_components_), Nyström only
        ``A = U S^-1/2 P_k``: ``transform(x) = k(x, landmarks_) @ A - offset_``.
    offset_ : ndarray of shape (n_components_,), Nyström only
        ``row_means_ @ projection_``, the embedding of the mean feature.
    mean_weights_ : ndarray of shape (n_landmarks_,), Nyström only
        ``W^+ c``: ``k(x, landmarks_) @ mean_weights_`` estimates
        ``mean_i k(x, x_i)`` (used by :meth:`score_samples`).
    n_samples_fit_ : int
        Rows of the training data.
    gamma_ : float or None
        The kernel coefficient used.
    n_components_ : int
        Components kept (those with positive eigenvalues).
    n_features_in_ : int
        Columns of X (n_samples for ``kernel="precomputed"``, as scikit-learn).
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Column names of a DataFrame passed to fit (all strings); transform
        then refuses columns in another order or with other names.
    eigen_solver_ : str
        Solver actually used.
    n_passes_ : int
        Passes over the kernel blocks the fit made (Nyström: passes over X
        computing ``k(X, Z)``, not counting reading the landmark sample).
    converged_ : bool
        Whether every returned pair is certified to ``tol`` (randomized
        solvers: ``solver_info_["certificate"]`` has the bounds; dense solves
        are always True). When False a
        :class:`~kpca_dask.exceptions.ConvergenceWarning` was emitted.
    X_transformed_fit_ : ndarray of shape (s, n_components_)
        ``fit_inverse_transform=True``: embedding of the rows the learned
        pre-image was trained on (scikit-learn's name; there all training rows).
    dual_coef_ : ndarray of shape (s, n_features_in_)
        ``fit_inverse_transform=True``: ``(k(X_transformed_fit_,
        X_transformed_fit_) + alpha I)^-1`` times those rows; the learned
        pre-image of ``z`` is ``k(z, X_transformed_fit_) @ dual_coef_``.
    preimage_indices_ : ndarray of shape (s,)
        Their row indices in the training data (sorted).
    preimage_ : str
        The pre-image method ``inverse_transform`` uses ("auto" resolved).
    preimage_mean_, preimage_components_ : linear kernel only
        ``(n_features_in_,)`` and ``(n_components_, n_features_in_)``: the exact
        pre-image is ``preimage_mean_ + z @ preimage_components_`` (for exact
        solvers the training mean and linear PCA's components).

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
        n_landmarks: int | None = None,
        landmark_method: str = "rpcholesky",
        landmark_sample_size: Any = "auto",
        nystroem_method: str = "auto",
        fit_inverse_transform: bool = False,
        alpha: float = 1.0,
        preimage: str = "auto",
        preimage_sample_size: Any = "auto",
        preimage_tol: float = 1e-5,
        preimage_max_iter: int = 100,
        remove_zero_eig: bool = False,
        iterated_power: Any = "auto",
        copy_X: bool = True,
        n_jobs: int | None = None,
        kernel_cache: str = "auto",
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
        self.n_landmarks = n_landmarks
        self.landmark_method = landmark_method
        self.landmark_sample_size = landmark_sample_size
        self.nystroem_method = nystroem_method
        self.fit_inverse_transform = fit_inverse_transform
        self.alpha = alpha
        self.preimage = preimage
        self.preimage_sample_size = preimage_sample_size
        self.preimage_tol = preimage_tol
        self.preimage_max_iter = preimage_max_iter
        self.remove_zero_eig = remove_zero_eig
        self.iterated_power = iterated_power
        self.copy_X = copy_X
        self.n_jobs = n_jobs
        self.kernel_cache = kernel_cache

    # ------------------------------------------------------------------ params
    def _check_params(self) -> None:
        V.validate_params(
            "KernelPCA",
            self.get_params(deep=False),
            {
                "n_components": [V.int_range(1), V.Rule("None", lambda v: v is None)],
                "kernel": [V.options(*_KERNEL_NAMES, "precomputed"),
                           V.Rule("a callable", callable)],
                "gamma": [V.real_range(0, lo_open=True, allow=("scale",)),
                          V.Rule("None", lambda v: v is None)],
                "degree": V.real_range(0, lo_open=True),
                "coef0": V.real_range(-np.inf),
                "kernel_params": [V.Rule("a dict", lambda v: isinstance(v, dict)),
                                  V.Rule("None", lambda v: v is None)],
                "eigen_solver": V.options("auto", "dense", "arpack", "randomized", "nystroem"),
                "n_oversamples": V.int_range(0),
                "n_power_iter": V.int_range(0, allow=("auto",)),
                "tol": [V.real_range(0), V.Rule("None", lambda v: v is None)],
                "max_iter": [V.int_range(1), V.Rule("None", lambda v: v is None)],
                "randomized_method": V.options("block_krylov", "subspace"),
                "chunk_size": V.int_range(1, allow=("auto",)),
                "n_landmarks": [V.int_range(1), V.Rule("None", lambda v: v is None)],
                "landmark_method": V.options(*LANDMARK_METHODS),
                "landmark_sample_size": V.int_range(1, allow=("auto",)),
                "nystroem_method": V.options("auto", "randomized", "covariance"),
                "fit_inverse_transform": V.Rule("a bool", lambda v: isinstance(v, (bool, np.bool_))),
                "alpha": V.real_range(0),
                "preimage": V.options(*PREIMAGE_METHODS),
                "preimage_sample_size": V.int_range(1, allow=("auto",)),
                "preimage_tol": V.real_range(0, lo_open=True),
                "preimage_max_iter": V.int_range(1),
                "kernel_cache": V.options(*KERNEL_CACHE_MODES),
                **_SKLEARN_PARAM_RULES,
            },
        )
        V.resolve_dtype(self.dtype)
        self._check_sklearn_params()
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
        """Fit and return the training embedding (numpy in, numpy out; dask or zarr
        in, dask out with the input's row chunks).

        Exact solvers: ``eigenvectors_ * sqrt(eigenvalues_)``. Nyström: the
        embedding of every training row by the fitted model, ``k(x, Z) A -
        offset_`` (one more pass over X, lazy for dask/zarr input: written
        block by block when stored or computed).
        """
        Xd, kind = self._fit(X, **params)
        if self.eigen_solver_ == "nystroem":
            return self._project_array(Xd, kind, "transform")
        emb = (self.eigenvectors_ * np.sqrt(self.eigenvalues_)).astype(self._out_dtype(),
                                                                       copy=False)
        if kind == "numpy":
            return emb
        return da.from_array(emb, chunks=(Xd.chunks[0], (emb.shape[1],)))

    _PREIMAGE_ATTRS = ("X_transformed_fit_", "dual_coef_", "preimage_indices_", "preimage_",
                       "preimage_mean_", "preimage_components_")

    _NYSTROEM_ATTRS = ("landmarks_", "landmark_indices_", "n_landmarks_", "projection_",
                       "offset_", "mean_weights_", "landmark_method_", "nystroem_method_")

    def _fit(self, X: Any, kernel_blocks: Any = None,
             centring: tuple[np.ndarray, float] | None = None) -> tuple[da.Array, str]:
        t0 = time.perf_counter()
        self._check_params()
        self._dtype = V.resolve_dtype(self.dtype)
        Xd, kind = self._validate_fit_input(X)
        n, d = (int(s) for s in Xd.shape)
        if self.n_components is not None:
            V.check_n_components(self.n_components, n)
        solver = self._resolve_solver(n, exact_inputs=kernel_blocks is not None
                                      or centring is not None or self._is_precomputed())
        if self.fit_inverse_transform:
            self._resolve_preimage(self.preimage)  # refuse a kernel mismatch before any pass
        precomputed = self._is_precomputed()
        if not precomputed:  # a precomputed K is checked by its own first read (inspect)
            V.check_finite(Xd)
        for attr in self._NYSTROEM_ATTRS + self._PREIMAGE_ATTRS:  # a refit leaves none behind
            self.__dict__.pop(attr, None)
        self.n_features_in_ = d
        self.n_samples_fit_ = n
        if self.chunk_size != "auto":
            r = min(int(self.chunk_size), n)
        elif solver == "nystroem":
            r = _auto_block_rows(n, target=NYSTROEM_BLOCK_ROWS)
        else:
            r = _auto_block_rows(n)
        self.chunk_size_ = r
        Xb = Xd if precomputed else Xd.rechunk({0: r, 1: -1})
        persisted = False
        if Xb is not Xd and kernel_blocks is None and (
                solver != "nystroem" or kind == "numpy" or Xb.nbytes <= NYSTROEM_PERSIST_BYTES):
            # Numpy input is in memory already (persisting keeps views of it);
            # a large dask/zarr input is re-read at every Nyström pass instead.
            # Products from stored kernel blocks never touch X: it is read once.
            Xb = Xb.persist()
            persisted = True

        self.gamma_ = self._resolve_gamma(Xb, n, d)
        self.kernel_ = self._make_kernel()
        self.eigen_solver_ = solver
        logger.info("KernelPCA fit: n=%d, d=%d, kernel=%s, solver=%s, %d blocks of %d rows, %s",
                    n, d, self.kernel_, solver, len(Xb.chunks[0]), r, self._dtype.name)
        if solver == "nystroem":
            res, mu, g, trace_K = self._solve_nystroem(Xb, n)
        else:
            if kernel_blocks is not None and self.chunk_size == "auto":
                raise InvalidParameterError(
                    "kernel_blocks needs an explicit integer chunk_size: the row blocks of the "
                    "stored kernel matrix."
                )
            if precomputed:
                K = self._precomputed_matrix(Xd, r)
            else:
                K = BlockKernelMatrix(Xb, self.kernel_, self._dtype, block_reader=kernel_blocks)
            with blas_threads_for_dask():
                (trace_K,) = dask.compute(K.diag().sum())
            with K.kernel_cache(self.kernel_cache, solver) as cache_info:  # released after
                if solver == "dense":
                    res, mu, g = self._solve_dense(K)
                elif solver == "arpack":
                    res, mu, g = self._solve_arpack(K, float(trace_K), centring)
                else:
                    res, mu, g = self._solve_randomized(K, n, centring)
            res.info["kernel_cache"] = cache_info
            # The training rows come to the driver after the solve, not during it: the
            # solver's basis (n x up to 552 floats) and X (n x d) are never held at once
            # (at n = 100k, d = 1024 they are 0.44 and 0.82 GB).
            if precomputed:  # transform takes kernel values: no training rows to keep
                self.X_fit_ = np.zeros((n, 0))
            else:
                with blas_threads_for_dask():  # persisted blocks, else the source's own chunks
                    self.X_fit_ = _gather_rows(Xb if persisted else Xd)

        w, vecs, resid = select_eigenpairs(
            res.eigenvalues, res.eigenvectors, res.residuals, n_components=self.n_components,
            remove_zero_eig=bool(self.remove_zero_eig), dtype=self._dtype)
        self.eigenvalues_ = w
        if solver == "nystroem":
            self.projection_ = np.ascontiguousarray(vecs)
            self.offset_ = mu @ self.projection_
            self.eigenvectors_ = self._nystroem_eigenvectors()
        else:
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
        self._coef_cache = {}
        self._preimage_cache = None
        if self.fit_inverse_transform:
            self._fit_preimage(Xb, n)
        self.fit_seconds_ = time.perf_counter() - t0
        logger.info("KernelPCA fit done in %.2f s: %d components, %d passes, max residual %.2e",
                    self.fit_seconds_, self.n_components_, self.n_passes_,
                    float(np.max(resid)) if resid.size else 0.0)
        return Xd, kind

    def _nystroem_eigenvectors(self) -> np.ndarray:
        """``projection_ * sqrt(eigenvalues_)``, computed the same way after a reload."""
        return self.projection_ * np.sqrt(self.eigenvalues_)

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

    def _resolve_solver(self, n: int, exact_inputs: bool = False) -> str:
        """The solver for n samples; refuses impossible combinations before any pass."""
        solver = self.eigen_solver
        if solver == "nystroem":
            if exact_inputs:
                raise InvalidParameterError(
                    "kernel_blocks and centring describe the exact kernel matrix; "
                    "eigen_solver='nystroem' never uses it. Drop them or pick an exact solver."
                )
            m = self._resolve_n_landmarks(n)
            if self.n_components is not None and self.n_components > m:
                raise InvalidParameterError(
                    f"n_components={self.n_components} must be <= n_landmarks={m} for "
                    "eigen_solver='nystroem' (the Nyström features have at most m "
                    "dimensions); ask for fewer components or pass a larger n_landmarks."
                )
            return solver
        if solver == "arpack":
            k = n if self.n_components is None else self.n_components
            if k >= n - 1 and n > ARPACK_FORMED_MAX_SAMPLES:
                # ARPACK cannot compute n - 1 or more pairs; the fallback forms Kc (8 n^2 bytes)
                raise InvalidParameterError(
                    f"eigen_solver='arpack' computes at most n_samples - 2 components (asked "
                    f"for {k} of {n} samples, which would form the {n} x {n} matrix); pass a "
                    "smaller n_components, or eigen_solver='dense'.")
            return solver
        if self.n_components is None:
            if solver == "randomized":
                raise InvalidParameterError(
                    "eigen_solver='randomized' needs an explicit n_components "
                    "(None means all components, which only the dense solver computes)."
                )
            return "dense"
        if solver == "auto":
            l = self.n_components + self.n_oversamples
            if n <= DENSE_MAX_SAMPLES or 2 * l >= n:
                solver = "dense"
            elif (n > NYSTROEM_MIN_SAMPLES and not exact_inputs
                  and self.n_components <= self._resolve_n_landmarks(n)):
                return "nystroem"
            else:
                solver = "randomized"
        if solver == "randomized" and self.n_components >= n:
            raise InvalidParameterError(
                f"eigen_solver='randomized' needs n_components < n_samples (got "
                f"{self.n_components} for {n} samples); use eigen_solver='dense'."
            )
        if solver == "randomized" and self.n_components + self.n_oversamples >= n:
            # The block spans all n columns: Rayleigh-Ritz on the whole space is a dense
            # eigh of the centred matrix (n <= l, so small). Done directly it costs one
            # pass and its result does not depend on the BLAS kernels' rounding (the
            # randomized arithmetic differed in the last bit between CPUs here).
            logger.info("eigen_solver='randomized' with a block of %d columns >= n=%d: "
                        "solving densely (eigen_solver_='dense')",
                        self.n_components + self.n_oversamples, n)
            return "dense"
        return solver

    def _resolve_n_landmarks(self, n: int) -> int:
        m = DEFAULT_N_LANDMARKS if self.n_landmarks is None else int(self.n_landmarks)
        return min(m, n)

    def _solve_nystroem(self, Xb: da.Array, n: int
                        ) -> tuple[EigResult, np.ndarray, float, float]:
        """Landmarks, the W eigendecomposition, the passes over X; fills the
        Nyström-only attributes and returns the pieces ``_fit`` finishes with."""
        m = self._resolve_n_landmarks(n)
        if m > 16384:
            logger.warning("Nyström with %d landmarks forms %.1f GB m x m matrices on the driver",
                           m, 8 * m * m / 1e9)
        rng = _generator(self.random_state)
        sample = None if self.landmark_sample_size == "auto" else int(self.landmark_sample_size)
        t0 = time.perf_counter()
        lm = select_landmarks(Xb, m, self.landmark_method, self.kernel_, rng,
                              sample_size=sample, dtype=self._dtype)
        t_landmarks = time.perf_counter() - t0
        basis = nystroem_basis(lm.points, self.kernel_, self._dtype, shift=lm.column_means)
        if not self.kernel_.psd and basis.n_dropped:
            logger.info("Nyström: the kernel is not positive semi-definite; %d non-positive "
                        "eigenvalues of k(Z, Z) were dropped (the PSD part is used)",
                        basis.n_dropped)
        k = self.n_components
        l = (k or 0) + self.n_oversamples
        method = self.nystroem_method
        if method == "auto":
            method = choose_method(basis.m, self.n_features_in_, k, l)
        if k is None and method == "randomized":
            raise InvalidParameterError(
                "nystroem_method='randomized' needs an explicit n_components (None means "
                "all components: use nystroem_method='covariance')."
            )
        tol = self.tol
        if not tol:  # None or scikit-learn's 0: the precision's default
            tol = 1e-8 if self._dtype == np.float64 else 1e-5
        auto = self.nystroem_method == "auto" and method == "randomized"
        fit = nystroem_eigh(
            Xb, basis, k, method=method, n_oversamples=self.n_oversamples,
            n_power_iter=self._power_iter(), randomized_method=self.randomized_method, tol=tol,
            max_passes=self._max_passes(),
            random_state=np.random.default_rng(rng.integers(2**63)),
            warn=not auto,
        )
        if auto and not fit.converged:
            # "auto" escalates: the covariance method is exact on the Nyström problem
            logger.info("Nyström randomized eigensolve not certified after %d passes; "
                        "using the covariance method", fit.n_passes)
            first = {"n_passes": fit.n_passes, "certificate": fit.info.get("certificate")}
            fit = nystroem_eigh(Xb, basis, k, method="covariance")
            fit.n_passes += first["n_passes"]
            fit.info["escalated_from"] = first
            method = "covariance"
        lam, A, resid = fit.eigenvalues, fit.projection, fit.residuals
        if k is not None and lam.size < k:
            # The features have rank m' < k: pad with zero pairs, which
            # drop_nonpositive removes with its usual warning.
            pad = k - lam.size
            lam = np.concatenate([lam, np.zeros(pad)])
            A = np.hstack([A, np.zeros((A.shape[0], pad))])
            resid = np.concatenate([resid, np.full(pad, np.nan)])
        self.landmarks_ = self.X_fit_ = lm.points
        self.landmark_indices_ = lm.indices
        self.n_landmarks_ = int(lm.indices.size)
        self.landmark_method_ = lm.info.get("method", self.landmark_method)
        self.nystroem_method_ = method
        self.mean_weights_ = fit.mean_weights
        info = {"solver": "nystroem", "landmarks": lm.info, "landmark_seconds": t_landmarks,
                **fit.info}
        res = EigResult(lam, A, resid, n_passes=fit.n_passes, converged=fit.converged,
                        info=info)
        return res, fit.column_means, fit.grand_mean, fit.kernel_trace

    # ------------------------------------------------- scikit-learn's contract
    def _check_sklearn_params(self) -> None:
        """Combinations scikit-learn refuses, with its wording where its tests look for it."""
        if self._is_precomputed():
            if self.fit_inverse_transform:
                raise InvalidParameterError(
                    "Cannot fit_inverse_transform with a precomputed kernel: the pre-image "
                    "map needs the input rows. Pass the rows with a named kernel instead.")
            if self.eigen_solver == "nystroem":
                raise InvalidParameterError(
                    "eigen_solver='nystroem' evaluates the kernel at landmarks and cannot use "
                    "kernel='precomputed'; use 'dense', 'arpack' or 'randomized'.")
        if self.iterated_power != "auto" and self.n_power_iter != "auto":
            raise InvalidParameterError(
                "iterated_power (scikit-learn's name) and n_power_iter set the same thing; "
                "pass only one of them.")

    def _is_precomputed(self) -> bool:
        return isinstance(self.kernel, str) and self.kernel == "precomputed"

    def _power_iter(self) -> Any:
        """Randomized passes after the first: ``iterated_power`` when set, else ``n_power_iter``."""
        return self.n_power_iter if self.iterated_power == "auto" else self.iterated_power

    def _max_passes(self) -> int:
        """``max_iter`` for the randomized and Nyström solvers (None: 20)."""
        return DEFAULT_MAX_ITER if self.max_iter is None else int(self.max_iter)

    def _validate_fit_input(self, X: Any) -> tuple[da.Array, str]:
        """``X`` as a dask array (numpy, dask, zarr, scipy.sparse, DataFrame) and its kind;
        records ``feature_names_in_``; a precomputed kernel must be square."""
        names = V.feature_names(X)
        Xd, kind = V.as_dask_array(X)
        self.__dict__.pop("feature_names_in_", None)
        if names is not None:
            self.feature_names_in_ = names
        self._out_float32 = Xd.dtype == np.float32
        if self._is_precomputed() and Xd.shape[0] != Xd.shape[1]:
            V.check_finite(Xd)  # NaN/inf first, as scikit-learn (only on this error path)
            raise InvalidInputError(
                f"Precomputed matrix must be a square matrix. Input is a {Xd.shape[0]}x"
                f"{Xd.shape[1]} matrix; with kernel='precomputed' fit takes the n x n kernel "
                "matrix of the training rows.")
        V.check_min_samples(int(Xd.shape[0]))
        return Xd, kind

    def _check_feature_names(self, X: Any) -> None:
        """scikit-learn's rule: columns given by name must be the fitted ones, in order."""
        fitted = getattr(self, "feature_names_in_", None)
        names = V.feature_names(X)
        if fitted is None and names is None:
            return
        if fitted is None:
            warnings.warn("X has feature names, but KernelPCA was fitted without feature names",
                          UserWarning, stacklevel=4)
            return
        if names is None:
            if hasattr(X, "columns"):
                return
            warnings.warn("X does not have valid feature names, but KernelPCA was fitted with "
                          "feature names", UserWarning, stacklevel=4)
            return
        if len(names) == len(fitted) and np.all(names == fitted):
            return
        unseen = [c for c in names if c not in set(fitted)]
        missing = [c for c in fitted if c not in set(names)]
        # scikit-learn's sentences (its checks look for them), on one line
        msg = "The feature names should match those that were passed during fit."
        if unseen:
            msg += f" Feature names unseen at fit time: {unseen[:5]}."
        if missing:
            msg += f" Feature names seen at fit time, yet now missing: {missing[:5]}."
        if not unseen and not missing:
            msg += " Feature names must be in the same order as they were in fit."
        msg += " Pass the fitted columns in their order, e.g. X[model.feature_names_in_]."
        raise InvalidInputError(msg)

    def _precomputed_matrix(self, Kd: da.Array, r: int) -> PrecomputedKernelMatrix:
        """The caller's n x n kernel matrix as a block operator, after one read that refuses
        NaN/inf and decides whether its symmetric part must be formed."""
        K = PrecomputedKernelMatrix(Kd, self._dtype, block_rows=r)
        bad, asym, top = K.inspect()
        if bad:
            raise InvalidInputError(
                f"The precomputed kernel matrix contains NaN or infinity ({bad} value(s)); "
                "recompute it from finite data.")
        if not K.symmetric:
            logger.info("the precomputed kernel matrix is not symmetric (max |K - K^T| = %.3g "
                        "of max |K| = %.3g): its symmetric part is used", asym, top)
        return K

    def _solve_arpack(self, K: Any, trace_K: float,
                      centring: tuple[np.ndarray, float] | None = None
                      ) -> tuple[EigResult, np.ndarray, float]:
        """``eigen_solver="arpack"``: Lanczos (scipy's eigsh) on the implicit centred matrix,
        shifted by ``trace(Kc) / n`` so that a low-rank kernel's zero eigenvalues converge."""
        op = CentredKernel(K)
        if centring is not None:
            mu, g = centring
            op.row_means, op.grand_mean = np.asarray(mu, dtype=np.float64), float(g)
        op.compute_means()  # one pass (none when centring is given): g for the shift
        shift = max(0.0, (trace_K - K.n * float(op.grand_mean)) / K.n)
        k = K.n if self.n_components is None else int(self.n_components)
        res = arpack_eigh(op, k, tol=float(self.tol or 0.0), maxiter=self.max_iter,
                          random_state=self.random_state, shift=shift)
        if not res.converged:
            warnings.warn(
                f"ARPACK stopped at max_iter={self.max_iter} with {res.eigenvalues.size} of "
                f"{k} eigenpairs converged; raise max_iter (None: 10 n) or tol.",
                ConvergenceWarning, stacklevel=4)
        res.info["pass_seconds"] = list(op.pass_seconds)
        return res, op.row_means, float(op.grand_mean)

    def _more_tags(self) -> dict[str, Any]:  # scikit-learn < 1.6 reads tags from here
        return {"pairwise": self._is_precomputed(), "preserves_dtype": [np.float64, np.float32],
                "X_types": ["2darray", "sparse"]}

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.pairwise = self._is_precomputed()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

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
        if not tol:  # None or scikit-learn's 0: the precision's default
            tol = 1e-8 if self._dtype == np.float64 else 1e-5
        kw = dict(n_oversamples=self.n_oversamples, n_power_iter=self._power_iter(),
                  method=self.randomized_method, tol=tol, max_passes=self._max_passes(),
                  psd=self.kernel_.psd, eps=float(np.finfo(self._dtype).eps),
                  random_state=self.random_state)
        auto = self.eigen_solver == "auto"
        res = randomized_eigh(op, self.n_components, warn=not auto, **kw)
        if auto and not res.converged:
            # "auto" escalates before it gives up (solvers.randomized.escalation_plan)
            plan = escalation_plan(n, self.n_components, kw, DENSE_FALLBACK_SAMPLES)
            logger.info("randomized solver not certified after %d passes; escalating to %s",
                        res.n_passes, plan["solver"])
            first = {"n_passes": res.n_passes, "certificate": res.info.get("certificate")}
            if plan["solver"] == "dense":
                res2, mu, g = self._solve_dense(K)
                self.eigen_solver_ = "dense"
            else:
                res2 = randomized_eigh(op, self.n_components, warn=False, **plan["kwargs"])
                mu, g = op.row_means, float(op.grand_mean)
                if not res2.converged:
                    warnings.warn(not_converged_message(
                        res2.info["certificate"], res.n_passes + res2.n_passes, tol,
                        escalated=True), ConvergenceWarning, stacklevel=4)
            res2.n_passes += res.n_passes
            res2.info["escalated_from"] = first
            res = res2
        else:
            mu, g = op.row_means, float(op.grand_mean)
        res.info["pass_seconds"] = list(op.pass_seconds)
        k = self.n_components
        if res.eigenvalues.shape[0] < k:
            # numerical rank below k: the missing pairs are zero eigenvalues, as
            # dense eigh reports them (drop_nonpositive then treats both alike)
            pad = k - res.eigenvalues.shape[0]
            res.eigenvalues = np.concatenate([res.eigenvalues, np.zeros(pad)])
            res.eigenvectors = np.hstack([res.eigenvectors, np.zeros((n, pad))])
            res.residuals = np.concatenate([res.residuals, np.zeros(pad)])
        return res, mu, g

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

    def _coefficients(self) -> tuple[np.ndarray, tuple, str]:
        """Coefficients on ``X_fit_`` and the centring constants of :func:`_project_block`.

        Exact: ``[A, 1]`` with ``A = V / sqrt(lambda)``, and ``(mu^T A, 1^T A,
        g, n)``. Nyström: ``[projection_, mean_weights_]`` and ``(offset_, 0, g,
        1)``: the embedding is ``k(x, Z) A - offset_`` and ``k(x, Z) .
        mean_weights_`` stands in for ``mean(k(x, X))``.
        """
        holder = self.__dict__.get("_coef_cache")
        if not isinstance(holder, dict):  # a loaded model; fit creates the holder, so that
            holder = self._coef_cache = {}  # transform leaves __dict__ unchanged (sklearn)
        cache = holder.get("coef")
        if cache is None:
            if self._is_nystroem():
                A = self.projection_
                A_aug = np.hstack([A, self.mean_weights_[:, None]])
                consts = (self.offset_, np.zeros(A.shape[1]), float(self.grand_mean_), 1.0)
            else:
                A = self.eigenvectors_ * inv_sqrt(self.eigenvalues_)  # zero components: 0
                A_aug = np.hstack([A, np.ones((A.shape[0], 1))])
                consts = (self.row_means_ @ A, A.sum(axis=0), float(self.grand_mean_),
                          self.X_fit_.shape[0])
            token = tokenize(self.X_fit_, A_aug, consts, self.kernel_, str(self._dtype))
            cache = (A_aug, consts, token)
            holder["coef"] = cache
        return cache

    def _is_nystroem(self) -> bool:
        return getattr(self, "eigen_solver_", None) == "nystroem"

    def _project(self, X: Any, what: str) -> Any:
        self._check_fitted()
        self._check_feature_names(X)
        Xd, kind = V.as_dask_array(X)
        if self._is_precomputed():
            n_fit = self.n_samples_fit_
            if Xd.shape[1] != n_fit:
                V.check_finite(Xd)  # NaN/inf first, as scikit-learn (only on this error path)
                raise InvalidInputError(
                    f"X has {Xd.shape[1]} features, but KernelPCA is expecting {n_fit} "
                    f"features as input: with kernel='precomputed' transform takes "
                    f"k(X_new, X_fit) of shape (n_queries, n_indexed), one column per "
                    f"training row; got {tuple(Xd.shape)} for {n_fit} indexed.")
        elif Xd.shape[1] != self.n_features_in_:
            raise InvalidInputError(
                f"X has {Xd.shape[1]} features, but KernelPCA is expecting "
                f"{self.n_features_in_} features as input (fitted with {self.n_features_in_}); "
                "pass data with the same columns as in fit."
            )
        V.check_finite(Xd)
        return self._project_array(Xd, kind, what)

    def _out_dtype(self, in_dtype: Any = None) -> np.dtype:
        """Embeddings are float32 when the input or the compute dtype is (scikit-learn:
        float32 in, float32 out), else float64."""
        f32 = self._dtype == np.float32 or (
            getattr(self, "_out_float32", False) if in_dtype is None else in_dtype == np.float32)
        return np.dtype(np.float32 if f32 else np.float64)

    def _project_array(self, Xd: da.Array, kind: str, what: str) -> Any:
        """The transform/score graph on validated data: one task per row block."""
        A_aug, consts, token = self._coefficients()
        k = self.n_components_
        out_cols = k if what == "transform" else 1
        Xr = Xd.rechunk({0: self.chunk_size_, 1: -1})
        name = f"kpca-{what}-" + tokenize(token, Xr.name)
        train_key, coef_key = "kpca-train-" + token, "kpca-coef-" + token
        dsk: dict[Any, Any] = {train_key: self.X_fit_, coef_key: A_aug}
        out_dtype = self._out_dtype(Xd.dtype) if what == "transform" else np.dtype(np.float64)
        for b in range(len(Xr.chunks[0])):
            if self._is_precomputed():
                dsk[(name, b, 0)] = (_project_precomputed_block, (Xr.name, b, 0), coef_key,
                                     consts, self._dtype.str, out_dtype.str)
            else:
                dsk[(name, b, 0)] = (_project_block, (Xr.name, b, 0), train_key, coef_key,
                                     consts, self.kernel_, self._dtype.str, what, out_dtype.str)
        graph = HighLevelGraph.from_collections(name, dsk, dependencies=[Xr])
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
        Nyström: ``n_landmarks_`` kernel evaluations and an m x k product per
        row, ``k(x, Z) @ projection_ - offset_``, whatever the training size.
        """
        return self._project(X, "transform")

    @available_if(lambda self: not self._is_precomputed())
    def score_samples(self, X: Any) -> Any:
        """Reconstruction error in feature space of each row (a novelty score).

        ``||phi_c(x)||^2 - sum_k emb_k(x)^2`` with
        ``||phi_c(x)||^2 = k(x, x) - 2 mean(k(x, X)) + g`` (Hoffmann 2007).
        Larger means farther from the principal subspace. Not available with
        ``kernel="precomputed"`` (it needs ``k(x, x)`` of the new rows).

        Nyström: the feature-space mean ``mu_phi`` is replaced by its
        projection ``P mu_phi`` on the span of the landmarks' features, so
        ``mean(k(x, X))`` becomes ``k(x, Z) W^+ c`` (``mean_weights_``) and g
        becomes ``c^T W^+ c`` (``grand_mean_``). The score is then the squared
        distance of ``phi(x) - P mu_phi`` from the principal subspace: the part
        of ``phi(x)`` outside the landmarks' span (``k(x, x) - k(x, Z) W^+ k(Z,
        x)``, large for rows unlike every landmark) plus the Nyström-feature
        reconstruction error. With all rows as landmarks it equals the exact
        score.
        """
        return self._project(X, "score")

    # -------------------------------------------------------------- pre-images
    def _resolve_preimage(self, method: str) -> str:
        """The pre-image method for ``method`` ("auto" resolved); refuses kernel mismatches."""
        name = "callable" if callable(self.kernel) else self.kernel
        if method == "auto":
            return "exact" if name == "linear" else "learned"
        if method == "fixed_point" and name != "rbf":
            raise InvalidParameterError(
                f"preimage='fixed_point' is the fixed-point iteration of Mika et al. for the "
                f"rbf kernel; kernel={name!r} has no such update. Use preimage='learned'.")
        if method == "exact" and name != "linear":
            raise InvalidParameterError(
                f"preimage='exact' exists only for the linear kernel (where phi is the "
                f"identity); kernel={name!r} has no exact pre-image. Use preimage='learned' "
                "(or 'fixed_point' for rbf).")
        if method not in PREIMAGE_METHODS:
            raise InvalidParameterError(
                f"Unknown pre-image method {method!r}; use one of {list(PREIMAGE_METHODS)}.")
        return method

    def _preimage_expansion(self):
        if self._is_nystroem():
            return nystroem_expansion(self.landmarks_, self.projection_, self.mean_weights_)
        return exact_expansion(self.X_fit_, self.eigenvectors_, self.eigenvalues_)

    def _fit_preimage(self, Xb: da.Array, n: int) -> None:
        """Train the learned pre-image on s rows (an s x s solve) and, for the linear
        kernel, the exact pre-image's mean and components."""
        size = self.preimage_sample_size
        if self._is_nystroem() and size == "auto":
            idx, rows = np.asarray(self.landmark_indices_, dtype=np.int64), self.landmarks_
            emb = self._embed_rows(rows)
        else:
            s = min(n, DEFAULT_PREIMAGE_SAMPLE_SIZE) if size == "auto" else int(size)
            # its own stream: the sample does not shift any other draw of the seed
            seed = _generator(self.random_state).integers(2**63)
            idx = sample_indices(n, s, np.random.default_rng([seed, 0x5EED]))
            if self._is_nystroem():
                with blas_threads_for_dask():
                    rows = np.asarray(Xb[idx].compute() if idx.size < n else Xb.compute(),
                                      dtype=np.float64)
                emb = self._embed_rows(rows)
            else:
                # as scikit-learn: the training embedding V sqrt(lambda), no kernel pass
                rows = self.X_fit_[idx]
                emb = (self.eigenvectors_[idx] * np.sqrt(self.eigenvalues_))
        if len(idx) > 16384:
            logger.warning("the learned pre-image solves a %d x %d system (%.1f GB); pass a "
                           "smaller preimage_sample_size", len(idx), len(idx),
                           8 * len(idx) ** 2 / 1e9)
        self.X_transformed_fit_ = np.ascontiguousarray(emb, dtype=np.float64)
        with driver_blas():  # one BLAS thread: see solvers.nystroem.driver_blas
            self.dual_coef_ = fit_learned_preimage(self.kernel_, self.X_transformed_fit_, rows,
                                                   float(self.alpha))
        self.preimage_indices_ = idx
        self.preimage_ = self._resolve_preimage(self.preimage)
        if not callable(self.kernel) and self.kernel == "linear":
            self.preimage_mean_, self.preimage_components_ = linear_preimage_basis(
                self._preimage_expansion())

    def _embed_rows(self, rows: np.ndarray) -> np.ndarray:
        """Embedding of a few in-memory rows, in float64 (learned pre-image targets)."""
        A_aug, consts, _ = self._coefficients()
        return _project_block(np.asarray(rows, dtype=np.float64), self.X_fit_, A_aug, consts,
                              self.kernel_, "<f8", "transform")

    def _preimage_constants(self, method: str) -> tuple[dict[str, Any], str]:
        cache = getattr(self, "_preimage_cache", None) or {}
        key = (method, float(self.preimage_tol), int(self.preimage_max_iter))
        if key not in cache:
            consts: dict[str, Any] = {}
            if method == "exact":
                consts.update(mean=self.preimage_mean_, components=self.preimage_components_)
            else:
                consts.update(kernel=self.kernel_, embedding=self.X_transformed_fit_,
                              dual_coef=self.dual_coef_)
            if method == "fixed_point":
                exp = self._preimage_expansion()
                consts.update(expansion=exp, scale=exp.scale(), tol=float(self.preimage_tol),
                              max_iter=int(self.preimage_max_iter))
            exp = consts.get("expansion")
            token = tokenize(method, self.kernel_, consts.get("embedding"),
                             consts.get("dual_coef"), consts.get("mean"),
                             consts.get("components"), consts.get("tol"),
                             consts.get("max_iter"), *((exp.points, exp.b, exp.B) if exp else ()))
            cache[key] = (consts, token)
            self._preimage_cache = cache
        return cache[key]

    def inverse_transform(self, X: Any, *, method: str | None = None,
                          return_status: bool = False) -> Any:
        """Pre-images of embeddings: from ``(n, n_components_)`` back to ``(n, n_features_in_)``.

        Numpy in, numpy out; dask or zarr in, lazy dask array out (one task per
        row block of the input). Needs ``fit_inverse_transform=True``.

        Parameters
        ----------
        X : array of shape (n_samples, n_components_)
            Embeddings, e.g. ``transform(X_noisy)`` (denoising).
        method : {"learned", "fixed_point", "exact"} or None, default=None
            Overrides ``preimage_`` for this call (any fitted model has the
            learned map; "fixed_point" needs the rbf kernel, "exact" the linear one).
        return_status : bool, default=False
            Also return an int8 array per row: 0 converged (always, except for
            the fixed point), 1 reached ``preimage_max_iter``, 2 vanishing or
            negative denominator, or diverged (rows 1 and 2 hold the learned
            pre-image). No warning is emitted then: the caller has the counts.

        Returns
        -------
        X_original : array of shape (n_samples, n_features_in_)
            In the model's dtype. The fixed point warns with
            :class:`~kpca_dask.exceptions.PreimageConvergenceWarning` when rows
            fall back (numpy input: once, with the counts; dask input: from
            the block tasks, which a distributed worker logs instead).

        Notes
        -----
        Cost per row: learned ``s (n_components_ + n_features_in_)`` with ``s =
        len(X_transformed_fit_)``; exact ``n_components_ n_features_in_``;
        fixed point, per iteration, ``(n_components_ + n_features_in_)`` times
        the expansion size (landmarks for Nyström, every training row for
        exact solvers: use the learned map when that is large).
        """
        self._check_fitted()
        if not hasattr(self, "dual_coef_"):
            raise NotFittedError(
                "The fit_inverse_transform parameter was not set to True when fitting, so "
                "the inverse transform is not available; refit with "
                "KernelPCA(fit_inverse_transform=True, ...).")
        method = self.preimage_ if method is None else self._resolve_preimage(method)
        V.validate_params("KernelPCA", self.get_params(deep=False), {
            "preimage_tol": V.real_range(0, lo_open=True), "preimage_max_iter": V.int_range(1)})
        if method == "exact" and getattr(self, "preimage_components_", None) is None:
            raise InvalidParameterError("method='exact' needs the linear kernel.")
        Zd, kind = V.as_dask_array(X, what="Z")
        k = self.n_components_
        if Zd.shape[1] != k:
            raise InvalidInputError(
                f"inverse_transform takes embeddings with {k} columns (n_components_), got "
                f"{Zd.shape[1]}; pass the output of transform.")
        if kind == "numpy":
            V.check_finite(Zd, what="Z")
        consts, token = self._preimage_constants(method)
        d = self.n_features_in_
        if kind == "numpy":
            rows = max(64, min(self.chunk_size_, -(-Zd.shape[0] // 8)))
            Zr = Zd.rechunk({0: rows, 1: -1})
        else:
            Zr = Zd.rechunk({1: -1})
        warn_in_task = kind != "numpy" and not return_status
        name = "kpca-preimage-" + tokenize(token, Zr.name, warn_in_task)
        ckey = "kpca-preimage-consts-" + token
        dsk: dict[Any, Any] = {ckey: consts}
        for b in range(len(Zr.chunks[0])):
            dsk[(name, b, 0)] = (preimage_block, (Zr.name, b, 0), ckey, method, warn_in_task)
        graph = HighLevelGraph.from_collections(name, dsk, dependencies=[Zr])
        both = da.Array(graph, name, chunks=(Zr.chunks[0], (d + 1,)), dtype=np.float64)
        out = both[:, :d].astype(self._dtype)
        status = both[:, d].astype(np.int8)
        if kind == "numpy":
            with blas_threads_for_dask():
                res, st = dask.compute(out, status)
            if not return_status:
                warn_not_converged(st, int(self.preimage_max_iter))
                return res
            return res, st
        return (out, status) if return_status else out

    def _extra_arrays(self) -> dict[str, np.ndarray]:
        """Arrays the pre-image needs (saved by :mod:`kpca_dask.persistence`)."""
        if not hasattr(self, "dual_coef_"):
            return {}
        arrays = {"preimage_embedding": self.X_transformed_fit_,
                  "preimage_dual_coef": self.dual_coef_,
                  "preimage_indices": np.asarray(self.preimage_indices_, dtype=np.int64)}
        if getattr(self, "preimage_components_", None) is not None:
            arrays.update(preimage_mean=self.preimage_mean_,
                          preimage_components=self.preimage_components_)
        return arrays

    def _extra_attrs(self) -> dict[str, Any]:
        if not hasattr(self, "dual_coef_"):
            return {}
        return {"preimage": {"method": self.preimage_}}

    def _restore_extra(self, extra: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`_extra_arrays`/:meth:`_extra_attrs`; raises ModelFormatError."""
        from .exceptions import ModelFormatError

        self._preimage_cache = None
        info = extra.get("preimage") if isinstance(extra, dict) else None
        if not self.fit_inverse_transform:
            return
        if not isinstance(info, dict) or "preimage_dual_coef" not in arrays:
            raise ModelFormatError(
                "the model says fit_inverse_transform=True but lacks its pre-image arrays "
                "(preimage_embedding, preimage_dual_coef); re-save it from a fitted model.")
        method = info.get("method")
        E, D = arrays.get("preimage_embedding"), arrays["preimage_dual_coef"]
        idx = arrays.get("preimage_indices")
        k, d = self.n_components_, self.n_features_in_
        ok = (E is not None and idx is not None and E.ndim == 2 and D.ndim == 2
              and E.shape[1] == k and D.shape == (E.shape[0], d) and idx.shape == (E.shape[0],))
        if not ok or method not in PREIMAGE_METHODS[1:]:
            raise ModelFormatError(
                f"inconsistent pre-image arrays or method {method!r} for {k} components and "
                f"{d} features.")
        self.X_transformed_fit_, self.dual_coef_, self.preimage_indices_ = E, D, idx
        self.preimage_ = method
        if "preimage_components" in arrays:
            C, mu = arrays["preimage_components"], arrays.get("preimage_mean")
            if C.shape != (k, d) or mu is None or mu.shape != (d,):
                raise ModelFormatError("inconsistent linear pre-image arrays.")
            self.preimage_components_, self.preimage_mean_ = C, mu
        if method == "exact" and "preimage_components" not in arrays:
            raise ModelFormatError("an exact (linear) pre-image needs preimage_components.")

    # ------------------------------------------------------------ persistence
    def save(self, path: Any, *, overwrite: bool = False) -> None:
        """Save the fitted model as a zarr group (arrays + JSON, no pickle)."""
        from .persistence import save_model

        save_model(self, path, overwrite=overwrite)


def _project_precomputed_block(kb, A_aug, consts, dtype, out_dtype):
    """Embedding of new rows given their kernel values ``kb = k(x, X_fit)`` (m x n)."""
    P = np.asarray(kb, dtype=np.float64) @ A_aug
    return _finish_projection(P, None, None, A_aug, consts, dtype, "transform", out_dtype)


def _project_block(xb, X_fit, A_aug, consts, kernel, dtype, what, out_dtype=None):
    P = cross_products(kernel, xb, X_fit, A_aug, dtype)
    return _finish_projection(P, xb, kernel, A_aug, consts, dtype, what, out_dtype)


def _finish_projection(P, xb, kernel, A_aug, consts, dtype, what, out_dtype=None):
    muA, oneA, g, n = consts
    k = A_aug.shape[1] - 1
    s = P[:, k] / n  # mean(k(x, X)) per new row
    emb = P[:, :k] - muA[None, :] - s[:, None] * oneA[None, :] + g * oneA[None, :]
    if what == "transform":
        return emb.astype(out_dtype or dtype, copy=False)
    norm2 = kernel.diag(xb, np.float64) - 2.0 * s + g
    return (norm2 - np.einsum("ij,ij->i", emb, emb))[:, None]
