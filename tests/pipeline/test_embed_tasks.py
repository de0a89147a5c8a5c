"""The plan prices the embedding's tasks (pipeline/runtime/sizing.py
``EMBED_TASKS_PER_BLOCK`` a block of the fit's rows, besides its chunks' own): checked
against the graph the pipeline's embedding builds (``embed_rows``) for a real Nyström
fit, at two sizes."""

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
    emb = embed_rows(model, Xd)
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
    # per block: cut, transform, put together; besides: a few tasks a chunk and the model
    extra = len(graph) - EMBED_TASKS_PER_BLOCK * blocks
    assert 0 <= extra <= 3 * chunks + 4, (len(graph), blocks, chunks)
