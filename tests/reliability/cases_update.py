"""Update cases of the bad-input catalogue (issue 18): `kpca update` on a run that is not
there or into the base run itself, and `partial_fit` on models that cannot take rows
exactly, each refused in one line that names the problem and the fix."""

from __future__ import annotations

import numpy as np

from .catalogue import Case, N


def _missing_base(ctx):
    return ["update", ctx.dir / "no-such-run", ctx.npy(np.ones((5, 5)))]


def _into_base(ctx):
    return ["update", ctx.run, ctx.npy(np.ones((5, 5))), "--output", ctx.run / "v2"]


def _data(n=N, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 4))


def _no_statistics(ctx):
    from kpca_dask import KernelPCA

    est = KernelPCA(
        2, kernel="rbf", eigen_solver="nystroem", n_landmarks=20, keep_statistics=False
    ).fit(_data())
    return lambda: est.partial_fit(_data(20, 1))


def _exact_model(ctx):
    from kpca_dask import KernelPCA

    est = KernelPCA(2, kernel="rbf", eigen_solver="dense").fit(_data())
    return lambda: est.partial_fit(_data(20, 1))


def _wrong_width(ctx):
    from kpca_dask import KernelPCA

    est = KernelPCA(2, kernel="rbf", eigen_solver="nystroem", n_landmarks=20).fit(_data())
    return lambda: est.partial_fit(np.ones((20, 3)))


CASES = [
    Case(
        "update_missing_base",
        "update",
        "kpca update from a run folder that does not exist",
        _missing_base,
        ("does not exist", "check the path"),
    ),
    Case(
        "update_into_base",
        "update",
        "kpca update with --output inside the base run",
        _into_base,
        ("overlaps the base run", "never modified", "another --output"),
    ),
    Case(
        "partial_fit_no_statistics",
        "estimator",
        "partial_fit on a Nyström model fitted with keep_statistics=False",
        _no_statistics,
        ("keeps no sufficient statistics", "refit"),
    ),
    Case(
        "partial_fit_exact_model",
        "estimator",
        "partial_fit on an exact (dense) model",
        _exact_model,
        ("only Nyström models update", "refit"),
    ),
    Case(
        "partial_fit_wrong_width",
        "estimator",
        "partial_fit with rows of another width",
        _wrong_width,
        ("features", "same feature columns"),
    ),
]
