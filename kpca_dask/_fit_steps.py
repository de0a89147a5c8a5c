"""The steps of :meth:`KernelPCA.fit <kpca_dask.KernelPCA.fit>` around the eigensolve: the
checks and the plan, the scaling and the row blocks, the plan's attributes, the closing
log line; and the feature record (``record_features``).

``KernelPCA._fit_on`` runs them in order, and calls the steps that may warn (the centring,
the solve, the fitted attributes, the pre-image map) itself, so that a warning points at
the same frame as before. Nothing here knows the class: ``est`` is the estimator.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dask.array as da
import numpy as np

from . import plan as _plan
from . import preprocess as _pre
from . import validation
from ._fitted import STRATEGIES
from ._preimage_fit import PREIMAGE_ATTRS
from .exceptions import InvalidParameterError
from .plan import FitPlan
from .precision import is_distance_kernel
from .preprocess import Scaler

__all__ = ["adopt_plan", "blocks", "finish", "record_features", "start"]

logger = logging.getLogger("kpca_dask")


def start(
    est: Any, X: Any, kernel_blocks: Any, centring: Any, v0: Any
) -> tuple[dict[str, Any], da.Array, str, FitPlan, Any, Any]:
    """The parameters, the input as a dask array and its kind, the plan, the column
    statistics of the one checking pass over X (None for a precomputed kernel) and the
    checked start vectors ``v0``; records the feature names."""
    params = est.get_params(deep=False)
    _plan.check_params(params)
    est._dtype = validation.resolve_dtype(est.dtype)
    names = validation.feature_names(X)
    Xd, kind = _plan.validate_fit_input(X, est._is_precomputed())
    est.__dict__.pop("feature_names_in_", None)
    est.__dict__.pop("features_", None)
    if names is not None:
        est.feature_names_in_ = names
        est.features_ = {
            "names": [str(c) for c in names],
            "dtypes": [str(t) for t in X.dtypes],
        }
    est._out_float32 = Xd.dtype == np.float32
    n, d = (int(s) for s in Xd.shape)
    plan = _plan.make_plan(
        params, n, d, exact_inputs=kernel_blocks is not None or centring is not None
    )
    stats = None  # a precomputed K is checked by its own first read (inspect)
    if not plan.precomputed:  # one pass: NaN/inf, and the distance kernels' centre
        stats = validation.check_finite(
            Xd, names=names, column_stats=is_distance_kernel(est.kernel)
        )
    if v0 is not None:  # before any work on X: a wrong v0 costs nothing
        v0 = validation.check_start_vectors(v0, n, plan.solver)
    return params, Xd, kind, plan, stats, v0


def blocks(
    est: Any, Xd: da.Array, kind: str, plan: FitPlan, scaler: Scaler | None, kernel_blocks: Any
) -> tuple[da.Array, da.Array, bool, Scaler | None]:
    """The scaled input, its row blocks (persisted or not), whether they are persisted and
    the scaler; clears the attributes of a previous fit."""
    n, d = (int(s) for s in Xd.shape)
    est.preprocess_ = scaler = _pre.for_fit(
        est.preprocess, Xd, scaler, precomputed=plan.precomputed
    )
    if scaler is not None:
        Xd = scaler.transform(Xd)
    for model in STRATEGIES.values():  # a refit leaves no attribute of another kind
        for attr in model.ATTRS + PREIMAGE_ATTRS:
            est.__dict__.pop(attr, None)
    est.n_features_in_ = d
    est.n_samples_fit_ = n
    est.chunk_size_ = r = plan.block_rows
    Xb = Xd if plan.precomputed else Xd.rechunk({0: r, 1: -1})
    # Numpy input is in memory already (persisting keeps views of it); a large
    # dask/zarr input is re-read at every Nyström pass instead. Products from stored
    # kernel blocks never touch X: it is read once.
    persisted = Xb is not Xd and kernel_blocks is None and plan.persists(kind, Xb.nbytes)
    if persisted:
        Xb = Xb.persist()
    return Xd, Xb, persisted, scaler


def adopt_plan(est: Any, plan: FitPlan, Xb: da.Array, kernel_blocks: Any) -> None:
    """The resolved plan's attributes and log line; stored kernel blocks need an explicit
    ``chunk_size``."""
    est.gamma_ = plan.gamma
    est.kernel_ = plan.kernel
    est.eigen_solver_ = plan.solver
    logger.info(
        "KernelPCA fit: n=%d, d=%d, kernel=%s, solver=%s, %d blocks of %d rows, %s",
        est.n_samples_fit_,
        est.n_features_in_,
        est.kernel_,
        plan.solver,
        len(Xb.chunks[0]),
        est.chunk_size_,
        est._dtype.name,
    )
    if kernel_blocks is not None and est.chunk_size == "auto":
        raise InvalidParameterError(
            "kernel_blocks needs an explicit integer chunk_size: the row blocks of the "
            "stored kernel matrix."
        )


def finish(est: Any, t0: float) -> None:
    """``fit_seconds_`` and the closing log line."""
    est.fit_seconds_ = time.perf_counter() - t0
    logger.info(
        "KernelPCA fit done in %.2f s: %d components, %d passes, max residual %.2e",
        est.fit_seconds_,
        est.n_components_,
        est.n_passes_,
        float(np.max(est.residuals_)) if est.residuals_.size else 0.0,
    )


def record_features(est: Any, names: Any, dtypes: Any, info: dict[str, Any]) -> None:
    """:meth:`KernelPCA.record_features`: checks the names against the fitted model and
    records them (``feature_names_in_``, ``features_``)."""
    est._check_fitted()
    names = [str(c) for c in names]
    if len(names) != est.n_features_in_ or est._is_precomputed():
        raise InvalidParameterError(
            f"record_features got {len(names)} names for a model of "
            f"{est.n_features_in_} features; pass one name per column of X."
        )
    if len(set(names)) != len(names):
        dup = sorted({c for c in names if names.count(c) > 1})
        raise InvalidParameterError(f"record_features: names given twice: {dup}.")
    if dtypes is not None and len(dtypes) != len(names):
        raise InvalidParameterError("record_features: one dtype per name, or none.")
    est.feature_names_in_ = np.asarray(names, dtype=object)
    est.features_ = {
        "names": names,
        "dtypes": None if dtypes is None else [str(t) for t in dtypes],
        **info,
    }
