"""The estimator's parameters: their rules, the names they take, the checks that refuse
a bad value or combination before any data is read, and what the automatic values
resolve to -- ``chunk_size="auto"`` (:func:`auto_block_rows`) and ``gamma``
(:func:`resolve_gamma`, :func:`resolve_kernel`).

Light on purpose (numpy and the rules only, no dask): :func:`check_param` is how the
pipeline checks a config file's values when it loads it, before it starts anything
(pipeline/fitspec.py); :func:`check_params` is how ``fit`` and ``plan`` check them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import rules as R
from .exceptions import InvalidInputError, InvalidParameterError
from .kernels import make_kernel

__all__ = [
    "KERNEL_CACHE_MODES",
    "KERNEL_NAMES",
    "LANDMARK_METHODS",
    "PARAM_RULES",
    "PREIMAGE_METHODS",
    "auto_block_rows",
    "check_param",
    "check_params",
    "resolve_gamma",
    "resolve_kernel",
]

#: ``kernel_cache``: keep the kernel's upper blocks in memory when they fit ("auto"),
#: always ("memory"), or evaluate them at every pass ("recompute"); kpca_dask/gram.py.
KERNEL_CACHE_MODES = ("auto", "memory", "recompute")
#: ``preimage``: kpca_dask/preimage.py.
PREIMAGE_METHODS = ("auto", "learned", "fixed_point", "exact")
#: ``landmark_method``: kpca_dask/solvers/landmarks.py.
LANDMARK_METHODS = ("uniform", "kmeans++", "rpcholesky")

KERNEL_NAMES = ("linear", "poly", "polynomial", "rbf", "laplacian", "sigmoid", "cosine")

#: Rules of the parameters scikit-learn's KernelPCA has and this estimator took over.
_SKLEARN_PARAM_RULES = {
    "remove_zero_eig": R.Rule("a bool", lambda v: isinstance(v, (bool, np.bool_))),
    "iterated_power": R.int_range(0, allow=("auto",)),
    "copy_X": R.Rule("a bool", lambda v: isinstance(v, (bool, np.bool_))),
    "n_jobs": [R.int_range(-1 << 30), R.Rule("None", lambda v: v is None)],
}

_NONE = R.Rule("None", lambda v: v is None)
_BOOL = R.Rule("a bool", lambda v: isinstance(v, (bool, np.bool_)))

PARAM_RULES = {
    "n_components": [R.int_range(1), _NONE],
    "kernel": [R.options(*KERNEL_NAMES, "precomputed"), R.Rule("a callable", callable)],
    "gamma": [R.real_range(0, lo_open=True, allow=("scale",)), _NONE],
    "degree": R.real_range(0, lo_open=True),
    "coef0": R.real_range(-np.inf),
    "kernel_params": [R.Rule("a dict", lambda v: isinstance(v, dict)), _NONE],
    "eigen_solver": R.options("auto", "dense", "arpack", "randomized", "nystroem"),
    "n_oversamples": R.int_range(0),
    "n_power_iter": R.int_range(0, allow=("auto",)),
    "tol": [R.real_range(0), _NONE],
    "max_iter": [R.int_range(1), _NONE],
    "randomized_method": R.options("block_krylov", "subspace"),
    "chunk_size": R.int_range(1, allow=("auto",)),
    "n_landmarks": [R.int_range(1), _NONE],
    "landmark_method": R.options(*LANDMARK_METHODS),
    "landmark_sample_size": R.int_range(1, allow=("auto",)),
    "nystroem_method": R.options("auto", "randomized", "covariance"),
    "keep_statistics": [R.options("auto"), _BOOL],
    "fit_inverse_transform": _BOOL,
    "alpha": R.real_range(0),
    "preimage": R.options(*PREIMAGE_METHODS),
    "preimage_sample_size": R.int_range(1, allow=("auto",)),
    "preimage_tol": R.real_range(0, lo_open=True),
    "preimage_max_iter": R.int_range(1),
    "kernel_cache": R.options(*KERNEL_CACHE_MODES),
    #: kpca_dask/mixed.py, docs/precision.md
    "block_dtype": R.options("auto", "float32", "float64"),
    "preprocess": R.options("none", "standard", "robust"),
    **_SKLEARN_PARAM_RULES,
}


def _is_precomputed(params: Mapping[str, Any]) -> bool:
    return isinstance(params["kernel"], str) and params["kernel"] == "precomputed"


def check_params(params: Mapping[str, Any]) -> None:
    """Refuse invalid parameters (and combinations scikit-learn refuses), before any data."""
    R.validate_params("KernelPCA", dict(params), PARAM_RULES)
    R.resolve_dtype(params["dtype"])
    if _is_precomputed(params):
        if params["fit_inverse_transform"]:
            raise InvalidParameterError(
                "Cannot fit_inverse_transform with a precomputed kernel: the pre-image "
                "map needs the input rows. Pass the rows with a named kernel instead."
            )
        if params["eigen_solver"] == "nystroem":
            raise InvalidParameterError(
                "eigen_solver='nystroem' evaluates the kernel at landmarks and cannot use "
                "kernel='precomputed'; use 'dense', 'arpack' or 'randomized'."
            )
    if params["iterated_power"] != "auto" and params["n_power_iter"] != "auto":
        raise InvalidParameterError(
            "iterated_power (scikit-learn's name) and n_power_iter set the same thing; "
            "pass only one of them."
        )
    if params["kernel_params"] is not None and not callable(params["kernel"]):
        raise InvalidParameterError(
            f"kernel_params is only used with a callable kernel; for kernel="
            f"{params['kernel']!r} pass gamma, degree and coef0 directly."
        )


def check_param(name: str, value: Any) -> None:
    """Refuse one parameter's value by its own rule, in the words :func:`check_params`
    uses (a parameter without a rule here, like ``random_state``, is checked where it is
    used, as in :func:`check_params`)."""
    if name == "dtype":
        R.resolve_dtype(value)
    elif name in PARAM_RULES:
        R.validate_params("KernelPCA", {name: value}, {name: PARAM_RULES[name]})


# ------------------------------------------------------------------ chunk_size='auto'
#: Rows per block of the Nyström passes when ``chunk_size="auto"``: each task
#: computes ``rows x m`` kernel values in strips, so larger blocks only mean
#: fewer tasks (and fewer partial sums to add).
NYSTROEM_BLOCK_ROWS = 8192

#: Rows per block of the exact solvers' kernel partition below ``LARGE_BLOCK_MIN_SAMPLES``:
#: a 16 MB float32 block, tens of ms of work per task.
EXACT_BLOCK_ROWS = 2048

#: From this many samples the exact blocks have ``LARGE_BLOCK_ROWS`` rows: measured at
#: n = 100 000 (pipeline, 2 workers), 63.2 s against 72.5 s for the solve with 4096-row
#: blocks (README, "the exact solve against the roofline").
LARGE_BLOCK_MIN_SAMPLES = 50_000
LARGE_BLOCK_ROWS = 4096

#: Upper bound on the block tasks of one pass ("low thousands"): beyond it the blocks
#: grow instead. At ~1 ms of scheduler time a task (``kpca calibrate`` measures it) a
#: pass then costs seconds of scheduling, not minutes (measured: 119 805 tasks at
#: n = 1M with 2 045-row blocks). A cluster with more threads than this gets one task
#: per thread instead (no idle core), never more than ``MAX_TASKS_PER_PASS``.
TASKS_PER_PASS = 4000
MAX_TASKS_PER_PASS = 20_000

#: Largest block a worker allocates whole (a stored or read kernel block, the
#: ``memory`` cache's blocks) without glibc's mmap path: the workers'
#: ``MALLOC_MMAP_THRESHOLD_`` (pipeline.cluster.WORKER_MALLOC_ENV), whose ceiling on
#: 64-bit glibc is 32 MiB. A buffer above it is a fresh mmap whose pages fault in one by
#: one (docs/tuning.md: 76.5 ms against 38.4 ms a stored block).
STORED_BLOCK_BYTES = 32 << 20


def _upper_tasks(nb: int) -> int:
    return nb * (nb + 1) // 2


def auto_block_rows(
    n: int,
    solver: str = "randomized",
    *,
    threads: int | None = None,
    stored_itemsize: int | None = None,
    min_rows: int = 256,
) -> int:
    """Rows per block of the kernel partition (``chunk_size="auto"``): the one rule the
    estimator and the pipeline use.

    Exact solvers: about ``EXACT_BLOCK_ROWS`` rows, ``LARGE_BLOCK_ROWS`` from
    ``LARGE_BLOCK_MIN_SAMPLES`` rows on; larger blocks when a pass would have more than
    ``TASKS_PER_PASS`` upper-block tasks (or one per thread of a ``threads``-thread
    cluster, at most ``MAX_TASKS_PER_PASS``); at least 6 row blocks (21 tasks) when n
    allows, so that a pass balances over the cores. ``stored_itemsize``: the blocks are
    materialised whole (kernel store) in that many bytes per value: at most
    ``STORED_BLOCK_BYTES`` a block. Nyström: about ``NYSTROEM_BLOCK_ROWS`` rows, and at
    most ``TASKS_PER_PASS`` blocks (a task holds a strip, not its block).
    """
    n = int(n)
    if solver == "nystroem":
        nb = max(1, math.ceil(n / NYSTROEM_BLOCK_ROWS))
        nb = min(nb, TASKS_PER_PASS)
    else:
        target = LARGE_BLOCK_ROWS if n >= LARGE_BLOCK_MIN_SAMPLES else EXACT_BLOCK_ROWS
        if stored_itemsize:
            target = min(target, int(math.isqrt(STORED_BLOCK_BYTES // int(stored_itemsize))))
        nb = max(1, math.ceil(n / target))
        cap = max(TASKS_PER_PASS, int(threads or 0))
        cap = min(cap, MAX_TASKS_PER_PASS)
        if _upper_tasks(nb) > cap and not stored_itemsize:
            nb = max(1, (math.isqrt(8 * cap + 1) - 1) // 2)
    if nb < 6:
        nb = max(nb, min(6, n // min_rows))
    return math.ceil(n / nb)


# ------------------------------------------------------------------ gamma
def resolve_gamma(params: Mapping[str, Any], rows: Any, n: int, d: int) -> float | None:
    """``gamma`` as used: None for kernels without one, ``1 / d`` for None, the median
    heuristic on a sample of at most 1000 of ``rows`` for "scale"."""
    kernel, gamma = params["kernel"], params["gamma"]
    name = "callable" if callable(kernel) else kernel
    if name not in ("rbf", "laplacian", "poly", "polynomial", "sigmoid"):
        return None
    if gamma is None:
        return 1.0 / d
    if not isinstance(gamma, str):
        return float(gamma)
    if rows is None:
        raise ValueError("gamma='scale' is resolved from rows of X: pass them")
    seed = params["random_state"]
    rng = np.random.default_rng(seed if isinstance(seed, int) else 0)
    m = min(n, 1000)
    idx = np.sort(rng.choice(n, size=m, replace=False))
    S = np.asarray(rows[idx].compute(), dtype=np.float64)
    iu = np.triu_indices(m, 1)
    if name == "rbf":
        S = S - S.mean(axis=0)  # distances are translation invariant: no cancellation
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


def resolve_kernel(plan: Any, params: Mapping[str, Any], rows: Any) -> Any:
    """``plan`` (a :class:`~kpca_dask.plan.FitPlan`) with its kernel: ``gamma`` resolved
    (from a sample of ``rows``, a dask or numpy array, when "scale")."""
    gamma = resolve_gamma(params, rows, plan.n_samples, plan.n_features)
    kernel = make_kernel(
        params["kernel"],
        gamma=gamma,
        degree=params["degree"],
        coef0=params["coef0"],
        kernel_params=params["kernel_params"],
    )
    return dataclasses.replace(plan, gamma=gamma, kernel=kernel)
