# long: the public estimator's numpydoc (class, parameters, methods: ~500 lines) stays with it
"""``KernelPCA``: scikit-learn's estimator contract on top of the dask solvers.

The estimator holds the parameters and the fitted attributes, and orchestrates:
:mod:`kpca_dask.plan` decides the solver, blocks and kernel; ``kpca_dask._solve``
runs the eigensolve; ``kpca_dask._fitted`` knows what an exact or a Nyström
model keeps and how it embeds new rows (:mod:`kpca_dask.projection`);
``kpca_dask._preimage_fit`` trains and applies the pre-image map; ``kpca_dask._state``
converts the model to the state :mod:`kpca_dask.persistence` saves. The method bodies
live next door: ``kpca_dask._fit_steps`` (the steps of a fit) and ``kpca_dask._transform``
(transform, score and pre-image graphs).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.metaestimators import available_if

from . import _fit_steps, _transform
from . import cost as _cost
from . import plan as _plan
from ._eigvals import select_eigenpairs
from ._fitted import model_of
from ._preimage_fit import fit_preimage
from ._solve import solve
from ._state import restore, state_of

# the transform's scatter cache lives in ._transform; importable from here, as before
from ._transform import _SCATTERED, _SCATTERED_KEEP, SCATTER_BYTES, _on_cluster  # noqa: F401
from .exceptions import (
    NotFittedError,
    PartialFitUnavailableError,
)
from .persistence import load_state, save_state
from .plan import FitPlan
from .precision import centre_kernel, check_centred_scale
from .preimage import warn_not_converged
from .preprocess import Scaler
from .solvers.randomized import DEFAULT_N_OVERSAMPLES

__all__ = ["KernelPCA", "load"]

logger = logging.getLogger("kpca_dask")


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
    kernel : {"linear", "poly", "rbf", "laplacian", "sigmoid", "cosine", "precomputed"} \
            or callable, default="linear"
        A callable is called as ``kernel(A, B, **kernel_params)`` on two float64
        numpy blocks of rows and must return the ``(len(A), len(B))`` block; a
        callable written for scikit-learn (two 1-D rows in, a number out) is
        detected and called once per pair, as scikit-learn does (slow).
        "precomputed": ``fit`` takes the n x n kernel matrix (numpy, dask,
        zarr or scipy.sparse; read in square blocks, never copied whole; a
        matrix that is not exactly symmetric is used through its symmetric
        part, with an AsymmetricKernelWarning beyond rounding) and
        ``transform`` the ``n_new x n`` kernel between new and training rows
        (docs/sklearn.md). rbf and laplacian are evaluated on rows minus the
        training mean (``kernel_.center``; exact far from the origin,
        docs/solvers.md "Kernel evaluation").
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
    n_oversamples : int, default=16
        Extra columns of the randomized block (``l = n_components + n_oversamples``).
        Larger blocks converge in fewer passes; each pass costs GEMMs linear in
        ``l`` (plus a kernel evaluation when the kernel is not cached) and the
        driver's algebra grows with the basis. 16 was never slower than 24 and
        within 18 % of the fastest of 8 / 16 / 24 for 16 components on clustered
        and standard normal data, cached and recomputed kernels, float32 and
        float64 (docs/solvers.md).
    n_power_iter : int or "auto", default="auto"
        Randomized passes after the first; "auto" stops as soon as the
        a-posteriori certificate holds (see ``tol``).
    tol : float or None, default=None
        Randomized solver: relative eigenvalue accuracy it certifies (and an
        angle of ``sqrt(tol)`` for each eigenvector, or for the invariant
        subspace of a cluster of nearly equal eigenvalues), up to the rounding
        level of the kernel products; None or 0 (scikit-learn's default) means
        1e-8 for float64 and 1e-5 for float32 kernel evaluation. A flat tail
        that ``n_components`` cuts (relative gaps below 5 %) has no gap to
        define its vectors: its eigenvalues are certified to ``min(0.01, 100
        sqrt(tol))`` (1 % by default), its vectors not at all
        (``solver_info_["certificate"]["certified"]`` says per component:
        "vector", "subspace" or "eigenvalue only"; docs/solvers.md). A
        smaller ``tol`` certifies more. "arpack": ARPACK's tolerance (None or
        0: machine precision).
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
        Precision of the model: of kernel evaluation and in-block products
        (unless ``block_dtype`` makes the blocks float32), and of the
        certificate's default ``tol``; float32 is 2-3x faster for rbf-type
        kernels, with eigenvalues typically within 1e-7 relative. Embeddings are
        returned in this dtype; eigenvalues are always float64.
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
    keep_statistics : {"auto", True, False}, default="auto"
        Nyström only: keep the sufficient statistics (the m x m sum of the
        landmark kernel values' outer products, their column sums, the row
        count and trace) in the model, so that :meth:`partial_fit` adds rows
        exactly (the result equals a fit on all rows with the same
        landmarks; docs/update.md). "auto" keeps them when they are free
        (the covariance method); True makes ``nystroem_method="auto"`` use
        the covariance method (one pass, exact) and costs one more pass with
        an explicit "randomized"; False never keeps them (m x m floats
        fewer in the saved model).
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
        the blocks' dtype) fit the budget -- half of the workers' memory limits,
        or of the available RAM on the threaded scheduler; the dask config
        ``kpca.kernel-cache-budget`` (e.g. ``"400MB"``, set around ``fit`` with
        ``dask.config.set``) overrides it -- the tier "partial" when the budget
        holds some blocks but not all (those kept, the others evaluated at every
        pass: memory traded for time), else "recompute". The choice is in
        ``solver_info_["kernel_cache"]`` (docs/kernel-store.md, docs/tuning.md).
    block_dtype : {"auto", "float32", "float64"}, default="auto"
        Precision of the kernel blocks of a float64 model (randomized solver,
        rbf or laplacian kernel): "float32" is mixed precision -- blocks
        evaluated in float64 and kept (and multiplied) in float32, half the
        kernel cache, with the basis, Rayleigh-Ritz and results in float64;
        then one pass on the kernel evaluated afresh in float64 gives the
        eigenpairs and certifies them for the kernel itself; when that
        certificate does not hold at the requested levels the fit solves again
        on float64 blocks (warm start). "auto": float32 blocks from 8192 rows
        on when ``tol`` is at least 1e-9, else float64. "float64" forces
        float64 blocks. What was used: ``block_dtype_`` and ``solver_info_["mixed_precision"]``
        (docs/precision.md). A float32 model always has float32 blocks.
    preprocess : {"none", "standard", "robust"}, default="none"
        Feature scaling fitted on the training rows and kept in the model
        (:mod:`kpca_dask.preprocess`): "standard" is scikit-learn's
        StandardScaler (mean, population std), "robust" its RobustScaler
        (median, inter-quartile range). ``transform``, ``score_samples`` and
        ``fit``'s ``gamma="scale"`` see scaled rows; ``inverse_transform``
        returns rows in the original units. Constant columns are scaled by 1.
        The rows the model keeps (``X_fit_``, ``landmarks_``) are scaled rows.

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
        Column names of a DataFrame passed to fit (all strings), or those given
        to :meth:`record_features`. :meth:`transform` and :meth:`score_samples`
        then select a DataFrame's columns by name: the same columns in another
        order give the same result (scikit-learn refuses them); a missing
        column, or one the model was not fitted on, is refused in one line
        naming it; a numpy array is taken by position with scikit-learn's
        warning, a dask or zarr array by position without one. Saved with the
        model.
    features_ : dict
        Present with ``feature_names_in_``: ``{"names": [...], "dtypes":
        [...]}`` (dtypes of the DataFrame's columns at fit, or None) plus what
        :meth:`record_features` was told (the pipeline: id and label columns,
        how the features were chosen). Saved with the model.
    eigen_solver_ : str
        Solver actually used.
    dtype_ : numpy.dtype
        The dtype the model computes in (``dtype`` resolved; a property).
    n_passes_ : int
        Passes over the kernel blocks the fit made (Nyström: passes over X
        computing ``k(X, Z)``, not counting reading the landmark sample).
    converged_ : bool
        Whether every returned pair is certified to ``tol`` (randomized
        solvers: ``solver_info_["certificate"]`` has the bounds and what was
        certified per pair; a flat tail by its eigenvalues only, see ``tol``;
        dense solves are True unless rounding is above ``tol``). When False a
        :class:`~kpca_dask.exceptions.ConvergenceWarning` was emitted, or a
        :class:`~kpca_dask.exceptions.PrecisionWarning` saying that the kernel's
        rounding alone is above ``tol``.
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

    preprocess_ : kpca_dask.preprocess.Scaler or None
        The fitted scaling (None with ``preprocess="none"``).

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
        n_oversamples: int = DEFAULT_N_OVERSAMPLES,
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
        keep_statistics: Any = "auto",
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
        preprocess: str = "none",
        block_dtype: str = "auto",
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
        self.keep_statistics = keep_statistics
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
        self.preprocess = preprocess
        self.block_dtype = block_dtype

    # ---------------------------------------------------------------- planning
    def plan(
        self,
        X: Any,
        *,
        kernel_blocks: Any = None,
        centring: tuple[np.ndarray, float] | None = None,
        kernel: bool = True,
    ) -> FitPlan:
        """What :meth:`fit` would do on ``X``, decided without fitting.

        Checks the parameters and the shape of ``X`` (the same errors as ``fit``)
        and returns the :class:`~kpca_dask.plan.FitPlan`: the solver
        ``eigen_solver="auto"`` picks, the block partition, the kernel with its
        resolved ``gamma``, the dtype, the Nyström landmarks and the pass budget.
        Reads no data except a sample of at most 1000 rows for ``gamma="scale"``
        (``kernel=False``: none; the plan's ``kernel`` and ``gamma`` are then None);
        sets no attribute. ``kernel_blocks`` and ``centring`` are only tested for
        presence (they rule out Nyström), as in :meth:`fit`.

        Examples
        --------
        >>> import numpy as np
        >>> from kpca_dask import KernelPCA
        >>> X = np.random.default_rng(0).normal(size=(60_000, 8))
        >>> p = KernelPCA(16, kernel="rbf", gamma=0.1).plan(X)
        >>> p.solver, p.n_landmarks, p.block_rows, p.n_blocks
        ('nystroem', 2048, 7500, 8)
        """
        exact = kernel_blocks is not None or centring is not None
        return _plan.plan_fit(self.get_params(deep=False), X, exact_inputs=exact, kernel=kernel)

    # ----------------------------------------------------------------- fitting
    def fit(
        self,
        X: Any,
        y: Any = None,
        *,
        kernel_blocks: Any = None,
        centring: tuple[np.ndarray, float] | None = None,
        scaler: Scaler | None = None,
        v0: Any = None,
    ) -> KernelPCA:
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
        scaler : kpca_dask.preprocess.Scaler, optional
            A scaling already fitted on these training rows (e.g. by a distributed
            pipeline stage); used instead of fitting ``preprocess`` again. Stored
            ``kernel_blocks`` must then be those of the scaled rows.
        v0 : array of shape (n_samples, j), optional
            Starting vectors for the exact randomized solver (a warm start):
            approximations of the leading eigenvectors of the centred kernel
            matrix of ``X``, one row per row of ``X``. A previous model's, extended
            to new rows, come from :func:`kpca_dask.update.warm_start_vectors`.
            The stopping rule and its certificate are unchanged (the result is
            the cold fit's to the solver's tolerance); a good start only needs
            fewer passes (``n_passes_``). The dense and ARPACK solvers do without
            it (``solver_info_["warm_start"]`` says so); Nyström refuses it.
        """
        self._fit(X, kernel_blocks=kernel_blocks, centring=centring, scaler=scaler, v0=v0)
        return self

    @property
    def partial_fit(self):
        """Nyström estimators only (asked for, or chosen by "auto"): scikit-learn's checks
        and duck typing (``hasattr(est, "partial_fit")``) see an exact model as the
        batch-only estimator it is, and its AttributeError says why (a property rather
        than ``available_if``, whose error would hide that reason)."""
        if self.eigen_solver != "nystroem" and getattr(self, "eigen_solver_", None) != (
            "nystroem"
        ):
            solver = getattr(self, "eigen_solver_", None) or self.eigen_solver
            raise PartialFitUnavailableError(
                f"partial_fit: an exact ({solver}) model cannot take new rows: only Nyström "
                "models update exactly with new rows; refit on all rows (or fit with "
                "eigen_solver='nystroem')."
            )
        return self._partial_fit

    def _partial_fit(self, X: Any, y: Any = None) -> KernelPCA:
        """Add the rows ``X`` to a fitted Nyström model exactly (an unfitted estimator is
        fitted on ``X``).

        The model must keep its sufficient statistics (``keep_statistics``); the result
        equals a fit on all rows seen so far with the same landmarks (kpca_dask.update,
        docs/update.md). Costs one pass over ``X`` only.
        """
        if not self.__sklearn_is_fitted__():
            return self.fit(X)
        from .update import update

        return update(self, X)

    def fit_transform(self, X: Any, y: Any = None, **params: Any) -> Any:
        """Fit and return the training embedding (numpy in, numpy out; dask or zarr
        in, dask out with the input's row chunks).

        Exact solvers: ``eigenvectors_ * sqrt(eigenvalues_)``. Nyström: the
        embedding of every training row by the fitted model, ``k(x, Z) A -
        offset_`` (one more pass over X, lazy for dask/zarr input: written
        block by block when stored or computed).
        """
        Xd, kind = self._fit(X, **params)
        with self._execution.scheduler():
            return model_of(self).fit_embedding(self, Xd, kind)

    def _fit(self, X: Any, **kw: Any) -> tuple[da.Array, str]:
        # where the fit runs (a small fit on this process's threads rather than a
        # cluster that would not pay: kpca_dask.cost.choose_execution), said in
        # solver_info_["executed"]
        where = _cost.fit_execution(self, X, **kw)
        with where.scheduler():
            out = self._fit_on(X, **kw)
        self.solver_info_["executed"] = where.reason
        self._execution = where
        return out

    def _fit_on(
        self,
        X: Any,
        kernel_blocks: Any = None,
        centring: tuple[np.ndarray, float] | None = None,
        scaler: Scaler | None = None,
        v0: Any = None,
    ) -> tuple[da.Array, str]:
        # the steps that may warn are called here, at the depth their stacklevel counts
        t0 = time.perf_counter()
        params, Xd, kind, plan, stats, v0 = _fit_steps.start(
            self, X, kernel_blocks, centring, v0
        )
        n = int(Xd.shape[0])
        Xd, Xb, persisted, scaler = _fit_steps.blocks(
            self, Xd, kind, plan, scaler, kernel_blocks
        )
        plan = _plan.resolve_kernel(plan, params, Xb)
        plan = centre_kernel(plan, stats, scaler)
        _fit_steps.adopt_plan(self, plan, Xb, kernel_blocks)
        sol = solve(
            plan,
            params,
            Xd,
            Xb,
            persisted=persisted,
            kernel_blocks=kernel_blocks,
            centring=centring,
            v0=v0,
        )
        self._apply_solution(sol, n)
        check_centred_scale(self)  # rounding of an offset in feature space vs tol
        if self.fit_inverse_transform:
            fit_preimage(self, Xb, n)
        _fit_steps.finish(self, t0)
        return Xd, kind

    def _apply_solution(self, sol: Any, n: int) -> None:
        """The fitted attributes of a :class:`~kpca_dask._solve.Solution` on ``n`` rows
        (a fit, or an exact update of a Nyström model: kpca_dask.update)."""
        self.eigen_solver_ = sol.solver
        self.X_fit_ = sol.X_fit
        if sol.solver == "nystroem":
            self.landmarks_ = sol.X_fit
            for attr, value in sol.nystroem.items():
                setattr(self, attr, value)

        res, n_fit = sol.result, n
        w, vecs, resid = select_eigenpairs(
            res.eigenvalues,
            res.eigenvectors,
            res.residuals,
            n_components=self.n_components,
            remove_zero_eig=bool(self.remove_zero_eig),
            dtype=self._dtype,
        )
        self.eigenvalues_ = w
        model_of(self).set_solution(self, vecs, sol.row_means)
        self.residuals_ = resid
        self.row_means_ = sol.row_means
        self.grand_mean_ = g = sol.grand_mean
        self.kernel_trace_ = sol.kernel_trace
        self.centred_trace_ = sol.kernel_trace - n_fit * g
        self.explained_variance_ratio_ = w / self.centred_trace_
        self.n_components_ = int(w.shape[0])
        self.n_passes_ = res.n_passes
        self.converged_ = res.converged
        self.solver_info_ = res.info
        self._coef_cache = {}
        self._preimage_cache = None

    # ------------------------------------------------- scikit-learn's contract
    def _is_precomputed(self) -> bool:
        return isinstance(self.kernel, str) and self.kernel == "precomputed"

    def _more_tags(self) -> dict[str, Any]:  # scikit-learn < 1.6 reads tags from here
        return {
            "pairwise": self._is_precomputed(),
            "preserves_dtype": [np.float64, np.float32],
            "X_types": ["2darray", "sparse"],
        }

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.pairwise = self._is_precomputed()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

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
    def block_dtype_(self) -> str | None:
        """The precision of the kernel blocks the fitted eigenpairs come from
        ("float32": mixed precision, certified for the kernel itself; docs/precision.md).
        None for a loaded model: ``solver_info_`` is not saved."""
        self._check_fitted()
        info = getattr(self, "solver_info_", None)
        if info is None:
            return None
        return str(info.get("block_dtype", np.dtype(self._dtype).name))

    @property
    def dtype_(self) -> np.dtype:
        """The dtype the fitted model computes in (``dtype`` resolved by ``fit``)."""
        self._check_fitted()
        return self._dtype

    @property
    def _n_features_out(self) -> int:
        return self.n_components_

    def _coefficients(self) -> tuple[np.ndarray, tuple, str]:
        """Coefficients on ``X_fit_``, the centring constants of
        :func:`~kpca_dask.projection.project_block` and their token (cached)."""
        return _transform.coefficients(self)

    def _out_dtype(self, in_dtype: Any = None) -> np.dtype:
        """Embeddings are float32 when the input or the compute dtype is (scikit-learn:
        float32 in, float32 out), else float64."""
        return _transform.output_dtype(self, in_dtype)

    def _project_array(self, Xd: da.Array, kind: str, what: str, where: Any = None) -> Any:
        """The transform/score graph on validated data: one task per row block.
        ``where``: the execution :func:`kpca_dask.cost.transform_execution` chose for
        these numpy rows (decided here when not given)."""
        return _transform.project_array(self, Xd, kind, what, where)

    def transform(self, X: Any) -> Any:
        """Embed ``X``: numpy in, numpy out; dask or zarr in, lazy dask array out.

        Costs ``n_samples_fit`` kernel evaluations per row; a new row ``x`` is
        centred with the training statistics (``k(x, X) - mu - mean + g``).
        Nyström: ``n_landmarks_`` kernel evaluations and an m x k product per
        row, ``k(x, Z) @ projection_ - offset_``, whatever the training size.
        """
        return _transform.project(self, X, "transform")

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
        return _transform.project(self, X, "score")

    # -------------------------------------------------------------- pre-images
    def _embed_rows(self, rows: np.ndarray) -> np.ndarray:
        """Embedding of a few in-memory rows, in float64 (learned pre-image targets)."""
        return _transform.embed_rows(self, rows)

    def inverse_transform(
        self, X: Any, *, method: str | None = None, return_status: bool = False
    ) -> Any:
        """Pre-images of embeddings: ``(n, n_components_)`` back to ``(n, n_features_in_)``.

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
        out, status, kind = _transform.preimages(self, X, method, return_status)
        if kind == "numpy" and not return_status:
            warn_not_converged(status, int(self.preimage_max_iter))
        return (out, status) if return_status else out

    # ---------------------------------------------------------------- features
    def record_features(self, names: Any, *, dtypes: Any = None, **info: Any) -> KernelPCA:
        """Record the names (and dtypes) of the columns a fitted model was fitted on.

        For a model fitted on an array whose columns have names elsewhere (the
        pipeline fits on its zarr store of a table's columns): afterwards
        ``feature_names_in_`` holds ``names``, and :meth:`transform` selects a
        DataFrame's columns by name, as after a fit on a DataFrame. ``info``: more
        JSON values about the columns (the pipeline records its id and label
        columns and how the features were chosen). All of it is in ``features_``
        and saved with the model (its ``"features"`` block).
        """
        _fit_steps.record_features(self, names, dtypes, info)
        return self

    # ------------------------------------------------------------ persistence
    def save(self, path: Any, *, overwrite: bool = False) -> None:
        """Save the fitted model as a zarr group (arrays + JSON, no pickle)."""
        save_state(state_of(self), path, overwrite=overwrite)


def load(path: Any) -> KernelPCA:
    """Load a model saved with :meth:`KernelPCA.save` (arrays + JSON only).

    Raises :class:`~kpca_dask.exceptions.ModelFormatError` when the store is
    missing, incomplete, of an unknown schema version, or fails its checksums.
    """
    return restore(KernelPCA(), load_state(path))
