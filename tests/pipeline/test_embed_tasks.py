"""The plan prices the embedding's tasks (pipeline/runtime/sizing.py
``EMBED_TASKS_PER_BLOCK`` a block of the fit's rows, besides its chunks' own): checked
against the graph the pipeline's embedding builds (``embed_rows``) for a real Nyström
fit, at two sizes; and the stage reads each chunk of the ingest store once, as priced."""

from __future__ import annotations

import math

import dask
import dask.array as da
import numpy as np
import pytest

import kpca_dask
from pipeline.embed.transform import embed_rows
from pipeline.runtime.sizing import EMBED_TASKS_PER_BLOCK


@pytest.mark.parametrize("n, chunk", [(12_000, 6_000), (40_000, 20_000)])
def test_the_embedding_graph_has_the_tasks_the_plan_prices(n, chunk):
    X = np.random.default_rng(0).standard_normal((n, 8)).astype("float32")
    model = kpca_dask.KernelPCA(
        n_components=4, kernel="rbf", eigen_solver="nystroem", n_landmarks=128, random_state=0
    )
    with dask.config.set(scheduler="threads"):
        model.fit(da.from_array(X, chunks=(chunk, 8)))
    Xd = da.from_array(X, chunks=(chunk, 8))
    emb = embed_rows(model, Xd, one_read=True)  # as the project stage builds it
    graph = dict(emb.__dask_graph__())
    transforms = [
        k
        for k in graph
        if str(k[0] if isinstance(k, tuple) else k).startswith("kpca-transform")
    ]
    blocks = len(transforms)
    chunks = len(Xd.chunks[0])
    assert blocks > 2 * chunks  # the fit's blocks are smaller than the store's chunks
    assert blocks == math.ceil(n / math.ceil(n / blocks))  # blocks of the fit's rows
    # per block: cut, transform, put together; besides: a few tasks a chunk (its read, its
    # NaN check, its store: the plan prices one a chunk and transfer) and the model
    extra = len(graph) - EMBED_TASKS_PER_BLOCK * blocks
    assert 0 <= extra <= 4 * chunks + 4, (len(graph), blocks, chunks)


def test_the_embedding_reads_each_ingest_chunk_once(tmp_path, monkeypatch):
    """The plan prices one read of the ingest store (sizing._embed_io); transform's own
    NaN pass would be a second: the project stage's rows are read once, and a NaN in
    them is still an error, naming its row."""
    import zarr
    import zarr.storage

    n, chunk = 12_000, 3_000
    X = np.random.default_rng(1).standard_normal((n, 6))
    z = zarr.create_array(tmp_path / "x.zarr", shape=X.shape, chunks=(chunk, 6), dtype="f8")
    z[...] = X
    model = kpca_dask.KernelPCA(
        n_components=3, kernel="rbf", eigen_solver="nystroem", n_landmarks=64, random_state=0
    )
    with dask.config.set(scheduler="threads"):
        model.fit(X)
    reads: list[str] = []
    get = zarr.storage.LocalStore.get

    async def counted(self, key, *args, **kwargs):
        if "/c/" in key or key.startswith("c/"):
            reads.append(key)
        return await get(self, key, *args, **kwargs)

    monkeypatch.setattr(zarr.storage.LocalStore, "get", counted)

    def rows():
        return da.from_zarr(zarr.open_array(zarr.storage.LocalStore(tmp_path / "x.zarr")))

    with dask.config.set(scheduler="threads"):
        got = embed_rows(model, rows(), one_read=True).compute()
        once = sorted(reads)
        reads.clear()
        ref = embed_rows(model, rows()).compute()
    assert len(once) == n // chunk and len(set(once)) == len(once), once
    assert len(reads) == 2 * len(once)  # the estimator's transform: its NaN pass, the graph
    np.testing.assert_array_equal(got, ref)
    z[4321, 2] = np.nan
    with pytest.raises(kpca_dask.InvalidInputError, match="row 4321, column 2, value nan"):
        embed_rows(model, rows(), one_read=True).compute(scheduler="threads")
