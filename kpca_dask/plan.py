"""Planning a fit: the solver, the block partition, the kernel and the dtype, before any pass.

A :class:`FitPlan` is everything :meth:`KernelPCA.fit <kpca_dask.KernelPCA.fit>`
decides from the parameters and the shape of ``X`` before it touches the
kernel matrix: which solver ``eigen_solver="auto"`` picks, how many rows each
block of the kernel partition has, the kernel with its resolved ``gamma``, the
dtype of kernel evaluation, the number of Nyström landmarks and the pass
budget. ``fit`` follows the same plan, so a caller (the pipeline, a notebook)
can size a job, materialise the kernel matrix in the same blocks, or refuse a
configuration, without fitting:

>>> import numpy as np
>>> from kpca_dask import KernelPCA
>>> X = np.random.default_rng(0).normal(size=(5000, 8))
>>> plan = KernelPCA(16, kernel="rbf").plan(X)
>>> plan.solver, plan.block_rows, plan.n_blocks, plan.gamma
('randomized', 834, 6, 0.125)

Planning reads no data, except a sample of at most 1000 rows of ``X`` when
``gamma="scale"`` (the median heuristic). Invalid parameters and impossible
combinations (``eigen_solver="randomized"`` without ``n_components``, more
components than landmarks...) raise here, with the same errors as ``fit``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

from . import validation
from .exceptions import InvalidInputError, InvalidParameterError
from .kernels import Kernel

# the block-rows rule and the resolution of gamma live in .params (light: loading a
# pipeline config checks values there without dask); importable from here, as before
from .params import (  # noqa: F401
    EXACT_BLOCK_ROWS,
    LARGE_BLOCK_MIN_SAMPLES,
    LARGE_BLOCK_ROWS,
    MAX_TASKS_PER_PASS,
    NYSTROEM_BLOCK_ROWS,
    PREIMAGE_METHODS,
    STORED_BLOCK_BYTES,
    TASKS_PER_PASS,
    _is_precomputed,
    _upper_tasks,
    auto_block_rows,
    check_params,
    resolve_gamma,
    resolve_kernel,
)

__all__ = [
    "FitPlan",
    "auto_block_rows",
    "check_params",
    "make_plan",
    "plan_fit",
    "resolve_kernel",
    "resolve_preimage",
    "validate_fit_input",
]

logger = logging.getLogger("kpca_dask")

#: Below this many samples "auto" uses the dense solver: the crossover with the
#: randomized solver (benchmarks/bench_exact.py, benchmarks/results/exact-*.json);
#: dense memory grows as 8 n^2 bytes.
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

#: Dask or zarr inputs up to this size are persisted (read once) by the
#: Nyström solver when they must be rechunked; larger ones are re-read from
#: their source at every pass, so memory stays at a few blocks.
NYSTROEM_PERSIST_BYTES = 256 << 20


@dataclass(frozen=True)
class FitPlan:
    """What a fit of ``n_samples x n_features`` rows will do, decided before any pass.

    ``kernel`` and ``gamma`` are None in a plan made by :func:`make_plan` alone
    (``gamma="scale"`` needs rows); :func:`resolve_kernel` fills them in.
    """

    n_samples: int
    n_features: int
    #: "dense", "arpack", "randomized" or "nystroem": ``eigen_solver`` resolved
    #: ("auto" and the randomized solver's dense case). ``eigen_solver_`` after fit
    #: differs only when "auto" escalates an uncertified randomized solve to dense.
    solver: str
    #: Rows per block of the kernel partition (and per transform task): ``chunk_size_``.
    block_rows: int
    #: Precision of the model: its results, the basis and Rayleigh-Ritz (and, unless
    #: ``block_dtype`` says otherwise, kernel evaluation and in-block products).
    dtype: np.dtype
    #: Landmarks of the Nyström solver (None for the exact solvers).
    n_landmarks: int | None
    #: Cap on randomized and Nyström passes (``max_iter``, None: 20).
    max_passes: int
    #: Randomized passes after the first (``iterated_power`` when set, else ``n_power_iter``).
    power_iter: int | str
    #: Accuracy the randomized and Nyström solvers certify (``tol``, 0/None resolved).
    tol: float
    #: Pre-image method of ``fit_inverse_transform=True`` ("auto" resolved), else None.
    preimage: str | None
    #: ``kernel="precomputed"``: X is the n x n kernel matrix.
    precomputed: bool
    #: Stored kernel blocks or centring statistics are given (exact solvers only).
    exact_inputs: bool = False
    #: The kernel coefficient used (None for kernels without one).
    gamma: float | None = None
    #: The kernel, ``gamma`` resolved (None until :func:`resolve_kernel`).
    kernel: Kernel | None = None
    #: ``n_components`` and ``n_oversamples`` as given (the block width of the passes).
    n_components: int | None = None
    n_oversamples: int = 16
    #: The kernel's name as given ("callable" for a function), for the cost model.
    kernel_name: str = "rbf"
    #: ``nystroem_method`` as given ("covariance" for "auto" with ``keep_statistics=True``,
    #: as the solve decides).
    nystroem_method: str = "auto"
    #: Precision of the kernel blocks (``block_dtype`` resolved; None: ``dtype``).
    #: float32 with a float64 ``dtype`` is mixed precision (kpca_dask.mixed).
    block_dtype: np.dtype | None = None

    @property
    def mixed(self) -> bool:
        """float32 kernel blocks under a float64 model (docs/precision.md)."""
        return self.block_dtype is not None and self.block_dtype != self.dtype

    def estimate(self, cluster: Any = None, machine: Any = None, **kw: Any) -> Any:
        """The cost model's prediction for this plan (:func:`kpca_dask.cost.estimate`):
        tasks, bytes moved, memory and time per stage on ``cluster``
        (:class:`kpca_dask.cost.Cluster`; default: one worker of one thread) with the
        constants of ``machine`` (default: ``kpca calibrate``'s file, else built-in
        ones). Keywords: ``passes``, ``kernel_cache``, ``input_in_memory``.

        >>> import dask.array as da
        >>> from kpca_dask import KernelPCA
        >>> from kpca_dask.cost import Cluster
        >>> X = da.zeros((1_000_000, 64), chunks=(100_000, 64))
        >>> p = KernelPCA(16, kernel="rbf", eigen_solver="randomized").plan(X, kernel=False)
        >>> e = p.estimate(Cluster(workers=16, threads=8), passes=10)
        >>> e.block_tasks_per_pass <= 20_000
        True
        """
        from .cost import estimate

        kw.setdefault("n_components", self.n_components)
        kw.setdefault("n_oversamples", self.n_oversamples)
        kw.setdefault(
            "params", {"kernel": self.kernel_name, "nystroem_method": self.nystroem_method}
        )
        return estimate(self, cluster, machine, **kw)

    @property
    def n_blocks(self) -> int:
        """Row blocks of the partition: the kernel matrix has ``n_blocks (n_blocks + 1) / 2``
        upper blocks (exact solvers); a Nyström pass has ``n_blocks`` tasks."""
        return math.ceil(self.n_samples / self.block_rows)

    def persists(self, kind: str, nbytes: int) -> bool:
        """Whether the fit keeps the rechunked rows in memory rather than re-reading the
        source at each pass: always for in-memory input and the exact solvers (they read
        every block many times); for Nyström up to ``NYSTROEM_PERSIST_BYTES``."""
        return self.solver != "nystroem" or kind == "numpy" or nbytes <= NYSTROEM_PERSIST_BYTES


def resolve_preimage(kernel: Any, method: str) -> str:
    """The pre-image method for ``method`` ("auto" resolved); refuses kernel mismatches."""
    name = "callable" if callable(kernel) else kernel
    if method == "auto":
        return "exact" if name == "linear" else "learned"
    if method == "fixed_point" and name != "rbf":
        raise InvalidParameterError(
            f"preimage='fixed_point' is the fixed-point iteration of Mika et al. for the "
            f"rbf kernel; kernel={name!r} has no such update. Use preimage='learned'."
        )
    if method == "exact" and name != "linear":
        raise InvalidParameterError(
            f"preimage='exact' exists only for the linear kernel (where phi is the "
            f"identity); kernel={name!r} has no exact pre-image. Use preimage='learned' "
            "(or 'fixed_point' for rbf)."
        )
    if method not in PREIMAGE_METHODS:
        raise InvalidParameterError(
            f"Unknown pre-image method {method!r}; use one of {list(PREIMAGE_METHODS)}."
        )
    return method


def validate_fit_input(X: Any, precomputed: bool) -> tuple[da.Array, str]:
    """``X`` as a dask array (numpy, dask, zarr, scipy.sparse, DataFrame) and its kind; a
    precomputed kernel must be square; at least 2 rows."""
    Xd, kind = validation.as_dask_array(X)
    if precomputed and Xd.shape[0] != Xd.shape[1]:
        validation.check_finite(Xd)  # NaN/inf first, as scikit-learn (only on this error path)
        raise InvalidInputError(
            f"Precomputed matrix must be a square matrix. Input is a {Xd.shape[0]}x"
            f"{Xd.shape[1]} matrix; with kernel='precomputed' fit takes the n x n kernel "
            "matrix of the training rows."
        )
    validation.check_min_samples(int(Xd.shape[0]))
    return Xd, kind


def n_landmarks_for(params: Mapping[str, Any], n: int) -> int:
    """Landmarks of a Nyström fit on n rows: ``n_landmarks`` (None: 2048), at most n."""
    m = DEFAULT_N_LANDMARKS if params["n_landmarks"] is None else int(params["n_landmarks"])
    return min(m, n)


def resolve_solver(params: Mapping[str, Any], n: int, exact_inputs: bool = False) -> str:
    """The solver for n samples; refuses impossible combinations before any pass."""
    solver = params["eigen_solver"]
    k_req = params["n_components"]
    if solver == "nystroem":
        if exact_inputs:
            raise InvalidParameterError(
                "kernel_blocks and centring describe the exact kernel matrix; "
                "eigen_solver='nystroem' never uses it. Drop them or pick an exact solver."
            )
        m = n_landmarks_for(params, n)
        if k_req is not None and k_req > m:
            raise InvalidParameterError(
                f"n_components={k_req} must be <= n_landmarks={m} for "
                "eigen_solver='nystroem' (the Nyström features have at most m "
                "dimensions); ask for fewer components or pass a larger n_landmarks."
            )
        return solver
    if solver == "arpack":
        k = n if k_req is None else k_req
        if k >= n - 1 and n > ARPACK_FORMED_MAX_SAMPLES:
            # ARPACK cannot compute n - 1 or more pairs; the fallback forms Kc (8 n^2 bytes)
            raise InvalidParameterError(
                f"eigen_solver='arpack' computes at most n_samples - 2 components (asked "
                f"for {k} of {n} samples, which would form the {n} x {n} matrix); pass a "
                "smaller n_components, or eigen_solver='dense'."
            )
        return solver
    if k_req is None:
        if solver == "randomized":
            raise InvalidParameterError(
                "eigen_solver='randomized' needs an explicit n_components "
                "(None means all components, which only the dense solver computes)."
            )
        return "dense"
    l = k_req + params["n_oversamples"]
    if solver == "auto":
        if n <= DENSE_MAX_SAMPLES or 2 * l >= n:
            solver = "dense"
        elif (
            n > NYSTROEM_MIN_SAMPLES
            and not exact_inputs
            and k_req <= n_landmarks_for(params, n)
        ):
            return "nystroem"
        else:
            solver = "randomized"
    if solver == "randomized" and k_req >= n:
        raise InvalidParameterError(
            f"eigen_solver='randomized' needs n_components < n_samples (got "
            f"{k_req} for {n} samples); use eigen_solver='dense'."
        )
    if solver == "randomized" and l >= n:
        # The block spans all n columns: Rayleigh-Ritz on the whole space is a dense eigh
        # of the centred matrix (n <= l, so small). Done directly it costs one pass and its
        # result does not depend on the BLAS kernels' rounding.
        logger.info(
            "eigen_solver='randomized' with a block of %d columns >= n=%d: "
            "solving densely (eigen_solver_='dense')",
            l,
            n,
        )
        return "dense"
    return solver


def make_plan(
    params: Mapping[str, Any],
    n_samples: int,
    n_features: int,
    *,
    exact_inputs: bool = False,
    threads: int | None = None,
) -> FitPlan:
    """The plan of a fit on ``n_samples x n_features`` rows, without its kernel (no data read).

    ``params`` are the estimator's (``get_params(deep=False)``), already checked by
    :func:`check_params`. ``exact_inputs``: stored kernel blocks or centring statistics
    will be given (they rule out Nyström). ``threads``: of the cluster the fit will run
    on (None: the active one's, asked only when the block rule depends on it).
    """
    n, d = int(n_samples), int(n_features)
    if params["n_components"] is not None:
        validation.check_n_components(params["n_components"], n)
    precomputed = _is_precomputed(params)
    solver = resolve_solver(params, n, exact_inputs=exact_inputs or precomputed)
    preimage = (
        resolve_preimage(params["kernel"], params["preimage"])
        if params["fit_inverse_transform"]
        else None
    )
    if params["chunk_size"] != "auto":
        rows = min(int(params["chunk_size"]), n)
    else:
        if threads is None and solver != "nystroem" and n > 200_000:
            from .gram import _cluster_threads

            threads = _cluster_threads()
        rows = auto_block_rows(n, solver, threads=threads)
    dtype = validation.resolve_dtype(params["dtype"])
    tol = params["tol"]
    if not tol:  # None or scikit-learn's 0: the precision's default
        tol = 1e-8 if dtype == np.float64 else 1e-5
    power = (
        params["n_power_iter"]
        if params["iterated_power"] == "auto"
        else params["iterated_power"]
    )
    return FitPlan(
        n_samples=n,
        n_features=d,
        solver=solver,
        block_rows=rows,
        dtype=dtype,
        n_landmarks=n_landmarks_for(params, n) if solver == "nystroem" else None,
        max_passes=DEFAULT_MAX_ITER if params["max_iter"] is None else int(params["max_iter"]),
        power_iter=power,
        tol=float(tol),
        preimage=preimage,
        precomputed=precomputed,
        exact_inputs=exact_inputs,
        n_components=params["n_components"],
        n_oversamples=int(params["n_oversamples"]),
        kernel_name=params["kernel"] if isinstance(params["kernel"], str) else "callable",
        block_dtype=resolve_block_dtype(
            params, dtype, float(tol), solver, n, precomputed, exact_inputs
        ),
        # keep_statistics=True makes "auto" the covariance method (kpca_dask._solve)
        nystroem_method=(
            "covariance"
            if params.get("nystroem_method", "auto") == "auto"
            and params.get("keep_statistics", "auto") is True
            else params.get("nystroem_method", "auto")
        ),
    )


def resolve_block_dtype(
    params: Mapping[str, Any],
    dtype: np.dtype,
    tol: float,
    solver: str,
    n: int,
    precomputed: bool,
    exact_inputs: bool,
) -> np.dtype:
    """The precision of the kernel blocks (``block_dtype``; docs/precision.md).

    float32 blocks under a float64 model (mixed precision) need the randomized solver
    and an rbf or laplacian kernel (non-negative values: the rounding of the blocks is
    then bounded by ``u ||K||``, kpca_dask.mixed). "auto" chooses them for float64 models
    from ``mixed.MIXED_MIN_SAMPLES`` rows on, when ``tol`` is at least
    ``mixed.MIXED_MIN_TOL`` (below it float32 blocks cannot certify even a cluster's
    level ``tol**0.75``); the fit falls back to float64 blocks when the certificate on
    the float32 blocks does not hold at the requested levels.
    """
    from . import mixed

    choice = params.get("block_dtype", "auto")
    f32 = np.dtype(np.float32)
    if dtype == f32:
        if choice == "float64":
            raise InvalidParameterError(
                "block_dtype='float64' with dtype='float32': the blocks of a float32 model "
                "are float32; pass dtype='float64' (its blocks are float64 or mixed)."
            )
        return f32
    eligible = (
        solver == "randomized"
        and not precomputed
        and not exact_inputs
        and params["kernel"] in mixed.MIXED_KERNELS
    )
    if choice == "float64":
        return dtype
    if choice == "float32":
        if not eligible:
            raise InvalidParameterError(
                "block_dtype='float32' with a float64 model needs eigen_solver='randomized' "
                f"(or 'auto' resolving to it) and kernel in {mixed.MIXED_KERNELS}, with no "
                "stored kernel blocks or centring: pass dtype='float32' instead."
            )
        return f32
    if eligible and n >= mixed.MIXED_MIN_SAMPLES and tol >= mixed.MIXED_MIN_TOL:
        return f32
    return dtype


def plan_fit(
    params: Mapping[str, Any], X: Any, *, exact_inputs: bool = False, kernel: bool = True
) -> FitPlan:
    """Check ``params`` and the shape of ``X``, and plan the fit (see :class:`FitPlan`);
    ``kernel=False`` leaves the kernel unresolved (no data read even for gamma="scale")."""
    check_params(params)
    Xd, _ = validate_fit_input(X, _is_precomputed(params))
    n, d = (int(s) for s in Xd.shape)
    plan = make_plan(params, n, d, exact_inputs=exact_inputs)
    return resolve_kernel(plan, params, Xd) if kernel else plan
