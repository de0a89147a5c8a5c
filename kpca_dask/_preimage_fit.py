"""The estimator's pre-image map: training it at fit, and the inverse-transform graph.

The mathematics (learned map, fixed point, exact linear pre-image) is in
:mod:`kpca_dask.preimage`; this module connects it to a fitted model: which
rows the learned map is trained on (``kpca_dask._fitted`` strategies give their
embedding), the constants a block task needs, and the task graph.
"""

from __future__ import annotations

import logging
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ._fitted import NystroemModel, model_of
from .plan import resolve_preimage
from .preimage import (
    DEFAULT_PREIMAGE_SAMPLE_SIZE,
    fit_learned_preimage,
    linear_preimage_basis,
    preimage_block,
    sample_indices,
)
from .solvers.randomized import _generator
from .threads import blas_threads_for_dask, blas_threads_for_driver

__all__ = ["fit_preimage", "inverse_transform_graph", "preimage_constants"]

logger = logging.getLogger("kpca_dask")

#: attributes a fit with ``fit_inverse_transform=True`` sets (a refit removes them first)
PREIMAGE_ATTRS = (
    "X_transformed_fit_",
    "dual_coef_",
    "preimage_indices_",
    "preimage_",
    "preimage_mean_",
    "preimage_components_",
)


def fit_preimage(est: Any, Xb: da.Array, n: int) -> None:
    """Train the learned pre-image on s rows (an s x s solve) and, for the linear kernel,
    the exact pre-image's mean and components."""
    model = model_of(est)
    size = est.preimage_sample_size
    if model is NystroemModel and size == "auto":
        idx, rows = np.asarray(est.landmark_indices_, dtype=np.int64), est.landmarks_
        emb = est._embed_rows(rows)
    else:
        s = min(n, DEFAULT_PREIMAGE_SAMPLE_SIZE) if size == "auto" else int(size)
        # its own stream: the sample does not shift any other draw of the seed
        seed = _generator(est.random_state).integers(2**63)
        idx = sample_indices(n, s, np.random.default_rng([seed, 0x5EED]))
        rows, emb = model.preimage_rows(est, Xb, idx)
    if len(idx) > 16384:
        logger.warning(
            "the learned pre-image solves a %d x %d system (%.1f GB); pass a "
            "smaller preimage_sample_size",
            len(idx),
            len(idx),
            8 * len(idx) ** 2 / 1e9,
        )
    est.X_transformed_fit_ = np.ascontiguousarray(emb, dtype=np.float64)
    with blas_threads_for_driver():  # one BLAS thread for the driver's dense algebra
        est.dual_coef_ = fit_learned_preimage(
            embedding_kernel(est), est.X_transformed_fit_, rows, float(est.alpha)
        )
    est.preimage_indices_ = idx
    est.preimage_ = resolve_preimage(est.kernel, est.preimage)
    if not callable(est.kernel) and est.kernel == "linear":
        est.preimage_mean_, est.preimage_components_ = linear_preimage_basis(
            model.expansion(est)
        )


def embedding_kernel(est: Any) -> Any:
    """The learned pre-image's kernel: the model's kernel and gamma on the embedding space
    (scikit-learn's), without the input-space centre of a distance-based kernel (the
    embeddings have their own dimension and are centred already)."""
    return est.kernel_.with_center(None)


def preimage_constants(est: Any, method: str) -> tuple[dict[str, Any], str]:
    """What a block task of ``method`` needs, and its token (cached on the estimator)."""
    cache = getattr(est, "_preimage_cache", None) or {}
    key = (method, float(est.preimage_tol), int(est.preimage_max_iter))
    if key not in cache:
        consts: dict[str, Any] = {}
        if method == "exact":
            consts.update(mean=est.preimage_mean_, components=est.preimage_components_)
        else:
            consts.update(
                kernel=embedding_kernel(est),
                embedding=est.X_transformed_fit_,
                dual_coef=est.dual_coef_,
            )
        if method == "fixed_point":
            exp = model_of(est).expansion(est)
            consts.update(
                expansion=exp,
                scale=exp.scale(),
                tol=float(est.preimage_tol),
                max_iter=int(est.preimage_max_iter),
            )
        exp = consts.get("expansion")
        token = tokenize(
            method,
            est.kernel_,
            consts.get("embedding"),
            consts.get("dual_coef"),
            consts.get("mean"),
            consts.get("components"),
            consts.get("tol"),
            consts.get("max_iter"),
            *((exp.points, exp.b, exp.B) if exp else ()),
        )
        cache[key] = (consts, token)
        est._preimage_cache = cache
    return cache[key]


def inverse_transform_graph(
    est: Any, Zd: da.Array, kind: str, method: str, return_status: bool
) -> tuple[Any, Any]:
    """Pre-images of the validated embeddings ``Zd`` and their status: one task per row
    block (computed for numpy input, lazy otherwise; the tasks of lazy input warn
    themselves unless ``return_status``)."""
    consts, token = preimage_constants(est, method)
    d = est.n_features_in_
    if kind == "numpy":
        rows = max(64, min(est.chunk_size_, -(-Zd.shape[0] // 8)))
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
    out = both[:, :d].astype(est._dtype)
    status = both[:, d].astype(np.int8)
    if kind == "numpy":
        with blas_threads_for_dask():
            return dask.compute(out, status)
    return out, status
