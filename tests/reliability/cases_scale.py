"""Feature-scaling cases of the bad-input catalogue (issue 15): an unknown
``preprocess.scale``, scaling asked of a precomputed kernel, and a fitted scaler of another
width, each refused in one line that names the problem and the fix."""

from __future__ import annotations

import numpy as np

from .catalogue import Case


def _unknown_scale(ctx):
    data = ctx.npy(np.random.default_rng(0).normal(size=(60, 4)))
    return ["run", ctx.config(data, preprocess={"scale": "minmax"})]


def _precomputed(ctx):
    from kpca_dask import KernelPCA

    X = np.random.default_rng(0).normal(size=(30, 3))
    K = X @ X.T
    return lambda: KernelPCA(2, kernel="precomputed", preprocess="standard").fit(K)


def _scaler_width(ctx):
    from kpca_dask import KernelPCA
    from kpca_dask.preprocess import fit_scaler

    rng = np.random.default_rng(0)
    scaler = fit_scaler(rng.normal(size=(30, 5)), "standard")
    return lambda: KernelPCA(2, kernel="rbf").fit(rng.normal(size=(30, 3)), scaler=scaler)


CASES = [
    Case(
        "scale_unknown",
        "config",
        "preprocess.scale is not one of standard, robust, none",
        _unknown_scale,
        ("preprocess.scale", "'standard'", "'robust'", "'none'"),
    ),
    Case(
        "scale_precomputed",
        "estimator",
        "KernelPCA(preprocess='standard') with kernel='precomputed'",
        _precomputed,
        ("kernel='precomputed'", "scale the rows before computing the kernel"),
    ),
    Case(
        "scale_wrong_width",
        "estimator",
        "fit(scaler=...) with a scaler fitted on another number of columns",
        _scaler_width,
        ("fitted on 5 features but X has 3", "same columns"),
    ),
]
