"""Update cases of the bad-input catalogue (issue 18): `kpca update` on a run that is not
there or into the base run itself, and `partial_fit` on models that cannot take rows
exactly, each refused in one line that names the problem and the fix."""

from __future__ import annotations

import numpy as np

from .catalogue import RUN_D, Case, N


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


def _rows_rebuilt_unheld(ctx):
    """A base whose lineage names an ingest store rebuilt since with other rows that no
    hold kept (a store rebuilt by hand, or before holds existed; issue 36 keeps held rows):
    ``kpca update`` refuses in one line instead of refitting on other rows."""
    import shutil

    from pipeline.config import ChunkConfig, InputConfig
    from pipeline.data.ingest import ingest
    from pipeline.output.lineage import entry_record
    from pipeline.output.ownership import mark_folder
    from pipeline.output.store import Location
    from tests.published import rewrite_manifests

    rows = Location.at(str(ctx.dir / "night"))
    mark_folder(rows, "run")
    store = rows.child("work", "ingest.zarr")
    inp = InputConfig(path=str(ctx.npy(_data(40, 1), "rows.npy")))
    first = ingest(inp, ChunkConfig(), store, min_classes=1)
    entry = entry_record(store, n_rows=40, fingerprint=first.fingerprint)
    ctx.npy(_data(40, 2), "rows.npy")  # the same path, other rows: the store is rebuilt
    ingest(inp, ChunkConfig(), store, min_classes=1)
    base = ctx.dir / "base"
    shutil.copytree(ctx.run, base)
    rewrite_manifests(base, lambda m: {**m, "update": {"version": 2, "rows": [entry]}})
    batch = np.random.default_rng(3).normal(size=(10, RUN_D))
    return ["update", base, ctx.npy(batch), "--output", ctx.out, "--no-prefect"]


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
    Case(
        "update_lineage_rows_rebuilt",
        "update",
        "a lineage's ingest store rebuilt with other rows that no hold kept",
        _rows_rebuilt_unheld,
        ("no longer holds the rows the base run was published with", "re-run the full"),
    ),
]
