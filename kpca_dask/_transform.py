"""What a fitted :class:`~kpca_dask.estimator.KernelPCA` computes on new rows: the
transform and score graphs (one task per row block, the model's arrays scattered once to a
distributed cluster), the learned pre-images' targets and the inverse transform.

The estimator's methods call these with themselves as ``est``; nothing here knows the class.
"""

from __future__ import annotations

from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from . import cost as _cost
from . import plan as _plan
from . import validation
from ._finite_blocks import checked_blocks
from ._fitted import model_of
from ._preimage_fit import inverse_transform_graph
from .exceptions import InvalidInputError, InvalidParameterError, NotFittedError
from .projection import project_block
from .threads import blas_threads_for_dask

#: model arrays (training rows + coefficients) at least this large go to a distributed
#: cluster's workers once, instead of inside every transform graph: every graph would
#: otherwise ship them through the scheduler again (distributed warns from 10 MiB)
SCATTER_BYTES = 1 << 20
_SCATTERED: dict[tuple[int, str], list] = {}  # (client, model token) -> futures, newest last
_SCATTERED_KEEP = 4


#: a lazy (dask input) transform's graph is built, and its NaN check computed, on the
#: active scheduler: without a client, named as dask's threads so that dask's
#: ``get_scheduler`` and ``rechunk`` do not import ``distributed`` to look for one
_ACTIVE = _cost.Execution("scheduler", "the active dask scheduler")


def _on_cluster(token: str, *arrays: np.ndarray) -> list | None:
    """Futures of ``arrays`` on every worker of the current distributed client (scattered
    once per model and client, again if a worker that held them is gone), or None: no
    distributed client, or arrays small enough to travel in the graph."""
    if sum(a.nbytes for a in arrays) < SCATTER_BYTES:
        return None
    from .gram import _scheduler_kind

    kind, client = _scheduler_kind()
    if kind != "distributed":
        return None
    key = (id(client), token)
    futures = _SCATTERED.pop(key, None)
    if futures is None or any(f.status != "finished" for f in futures):
        futures = client.scatter(list(arrays), broadcast=True, hash=False)
    _SCATTERED[key] = futures
    while len(_SCATTERED) > _SCATTERED_KEEP:  # released: the workers drop them
        _SCATTERED.pop(next(iter(_SCATTERED)))
    return futures


def coefficients(est: Any) -> tuple[np.ndarray, tuple, str]:
    """Coefficients on ``X_fit_``, the centring constants of
    :func:`~kpca_dask.projection.project_block` and their token (cached)."""
    holder = est.__dict__.get("_coef_cache")
    if not isinstance(holder, dict):  # a loaded model; fit creates the holder, so that
        holder = est._coef_cache = {}  # transform leaves __dict__ unchanged (sklearn)
    cache = holder.get("coef")
    if cache is None:
        A_aug, consts = model_of(est).coefficients(est)
        token = tokenize(est.X_fit_, A_aug, consts, est.kernel_, str(est._dtype))
        cache = (A_aug, consts, token)
        holder["coef"] = cache
    return cache


def project(est: Any, X: Any, what: str, *, finite_pass: bool = True) -> Any:
    """``what`` (transform, score) of ``X``. ``finite_pass=False``: a dask input's NaN/inf
    check runs inside each block's task of the graph (an error when it is computed) instead
    of a pass of its own over ``X`` before the graph is built (:func:`kpca_dask.one_pass`)."""
    est._check_fitted()
    names = getattr(est, "feature_names_in_", None)
    X = validation.check_feature_names(names, X)  # a DataFrame's columns selected by name
    Xd, kind = validation.as_dask_array(X)
    if est._is_precomputed():
        n_fit = est.n_samples_fit_
        if Xd.shape[1] != n_fit:
            # NaN/inf first, as scikit-learn (only on this error path)
            validation.check_finite(Xd)
            raise InvalidInputError(
                f"X has {Xd.shape[1]} features, but KernelPCA is expecting {n_fit} "
                f"features as input: with kernel='precomputed' transform takes "
                f"k(X_new, X_fit) of shape (n_queries, n_indexed), one column per "
                f"training row; got {tuple(Xd.shape)} for {n_fit} indexed."
            )
    elif Xd.shape[1] != est.n_features_in_:
        raise InvalidInputError(
            f"X has {Xd.shape[1]} features, but KernelPCA is expecting "
            f"{est.n_features_in_} features as input (fitted with {est.n_features_in_}); "
            "pass data with the same columns as in fit."
        )
    # where the embedding runs (numpy rows: maybe this process's threads), decided
    # first so that the NaN check runs there too, not as a cluster round trip
    where = _cost.transform_execution(est, int(Xd.shape[0])) if kind == "numpy" else None
    col_names = None if est._is_precomputed() else names
    if finite_pass or kind == "numpy":
        with (where or _ACTIVE).scheduler():
            validation.check_finite(Xd, names=col_names)
    else:
        Xd = checked_blocks(Xd, names=col_names)
    scaler = getattr(est, "preprocess_", None)
    if scaler is not None:
        Xd = scaler.transform(Xd)
    return project_array(est, Xd, kind, what, where=where)


def output_dtype(est: Any, in_dtype: Any = None) -> np.dtype:
    """Embeddings are float32 when the input or the compute dtype is (scikit-learn:
    float32 in, float32 out), else float64."""
    f32 = est._dtype == np.float32 or (
        getattr(est, "_out_float32", False) if in_dtype is None else in_dtype == np.float32
    )
    return np.dtype(np.float32 if f32 else np.float64)


def project_array(est: Any, Xd: da.Array, kind: str, what: str, where: Any = None) -> Any:
    """The transform/score graph on validated data: one task per row block.
    ``where``: the execution :func:`kpca_dask.cost.transform_execution` chose for
    these numpy rows (decided here when not given)."""
    A_aug, consts, token = coefficients(est)
    model = model_of(est)
    k = est.n_components_
    out_cols = k if what == "transform" else 1
    with (where or _ACTIVE).scheduler():  # dask's rechunk would import distributed
        Xr = Xd.rechunk({0: est.chunk_size_, 1: -1})
    name = f"kpca-{what}-" + tokenize(token, Xr.name)
    train_key, coef_key = "kpca-train-" + token, "kpca-coef-" + token
    dsk: dict[Any, Any] = {train_key: est.X_fit_, coef_key: A_aug}
    if where is None and kind == "numpy":
        where = _cost.transform_execution(est, int(Xd.shape[0]))
    # scattered only for a graph the cluster runs: local threads cannot read futures
    on_cluster = (
        _on_cluster(token, est.X_fit_, A_aug)
        if where is None or where.where != "local threads"
        else None
    )
    if on_cluster is not None:  # the rows are on the workers: the graph names them
        dsk[train_key], dsk[coef_key] = on_cluster
    out_dtype = output_dtype(est, Xd.dtype) if what == "transform" else np.dtype(np.float64)
    for b in range(len(Xr.chunks[0])):
        dsk[(name, b, 0)] = model.block_task(
            est, (Xr.name, b, 0), train_key, coef_key, consts, what, out_dtype
        )
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[Xr])
    out = da.Array(graph, name, chunks=(Xr.chunks[0], (out_cols,)), dtype=out_dtype)
    if where is not None:
        with where.scheduler(), blas_threads_for_dask():
            (res,) = dask.compute(out)
        return res if what == "transform" else res[:, 0]
    with _ACTIVE.scheduler():
        out = out.rechunk({0: Xd.chunks[0]})
    return out if what == "transform" else out[:, 0]


def embed_rows(est: Any, rows: np.ndarray) -> np.ndarray:
    """Embedding of a few in-memory rows, in float64 (learned pre-image targets)."""
    A_aug, consts, _ = coefficients(est)
    return project_block(
        np.asarray(rows, dtype=np.float64),
        est.X_fit_,
        A_aug,
        consts,
        est.kernel_,
        "<f8",
        "transform",
    )


def preimages(
    est: Any, X: Any, method: str | None, return_status: bool
) -> tuple[Any, Any, str]:
    """:meth:`KernelPCA.inverse_transform` up to its warning: the pre-images (in the
    original units), their status and the input's kind."""
    est._check_fitted()
    if not hasattr(est, "dual_coef_"):
        raise NotFittedError(
            "The fit_inverse_transform parameter was not set to True when fitting, so "
            "the inverse transform is not available; refit with "
            "KernelPCA(fit_inverse_transform=True, ...)."
        )
    method = est.preimage_ if method is None else _plan.resolve_preimage(est.kernel, method)
    validation.validate_params(
        "KernelPCA",
        est.get_params(deep=False),
        {
            "preimage_tol": validation.real_range(0, lo_open=True),
            "preimage_max_iter": validation.int_range(1),
        },
    )
    if method == "exact" and getattr(est, "preimage_components_", None) is None:
        raise InvalidParameterError("method='exact' needs the linear kernel.")
    Zd, kind = validation.as_dask_array(X, what="Z")
    k = est.n_components_
    if Zd.shape[1] != k:
        raise InvalidInputError(
            f"inverse_transform takes embeddings with {k} columns (n_components_), got "
            f"{Zd.shape[1]}; pass the output of transform."
        )
    if kind == "numpy":
        validation.check_finite(Zd, what="Z")
    out, status = inverse_transform_graph(est, Zd, kind, method, return_status)
    scaler = getattr(est, "preprocess_", None)
    if scaler is not None:  # pre-images in the original units
        out = scaler.inverse_transform(out)
    return out, status, kind
