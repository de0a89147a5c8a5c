"""The estimator's parameters: their rules, the names they take, and the checks that
refuse a bad value or combination before any data is read.

Light on purpose (numpy and the rules only, no dask): :func:`check_param` is how the
pipeline checks a config file's values when it loads it, before it starts anything
(pipeline/fitspec.py); :func:`check_params` is how ``fit`` and ``plan`` check them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import rules as R
from .exceptions import InvalidParameterError

__all__ = [
    "KERNEL_CACHE_MODES",
    "KERNEL_NAMES",
    "LANDMARK_METHODS",
    "PARAM_RULES",
    "PREIMAGE_METHODS",
    "check_param",
    "check_params",
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
