"""A Nyström fit on a real multi-process distributed cluster equals the threaded one."""

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import get_task_stream
from sklearn.datasets import make_blobs

from kpca_dask import KernelPCA

pytestmark = pytest.mark.distributed

X, _ = make_blobs(6000, n_features=6, centers=8, random_state=3)


@pytest.mark.parametrize("method", ["randomized", "covariance"])
def test_nystroem_on_a_distributed_cluster(dask_client, method):
    """The passes run as tasks on both worker processes; landmarks, eigenpairs and the
    lazy training embedding equal the threaded scheduler's."""
    kw = dict(
        kernel="rbf",
        gamma=0.02,
        eigen_solver="nystroem",
        n_landmarks=200,
        nystroem_method=method,
        random_state=0,
        chunk_size=500,
    )
    Xd = da.from_array(X, chunks=(1000, -1))
    with dask.config.set(scheduler="threads"):  # threaded reference, client bypassed
        ref = KernelPCA(5, **kw)
        ref_emb = ref.fit_transform(Xd).compute()
    # the same rows, their blocks held by the two workers in turn: each block's tasks then
    # run where its rows are. From rows in the graph, the scheduler may put every one of a
    # small fit's block tasks on one worker (it did in a CI run, on a loaded machine:
    # tasks of milliseconds, no data to keep them apart), which is dask's right, not a
    # fault of the fit's graph
    workers = sorted(dask_client.scheduler_info(n_workers=-1)["workers"])
    assert len(workers) == 2, workers
    parts = [X[i : i + 1000] for i in range(0, len(X), 1000)]
    held = [dask_client.scatter(p, workers=[workers[i % 2]]) for i, p in enumerate(parts)]
    Xw = da.concatenate(
        [da.from_delayed(f, shape=p.shape, dtype=p.dtype) for f, p in zip(held, parts)]
    )
    with get_task_stream(dask_client) as stream:
        m = KernelPCA(5, **kw)
        emb = m.fit_transform(Xw)  # the client is the default scheduler here
        emb = emb.compute()
    keys = [str(t["key"]) for t in stream.data]
    block_workers = {t["worker"] for t in stream.data if "kpca-nys-block" in str(t["key"])}
    assert len(block_workers) == 2, "the passes did not run on both worker processes"
    assert sum("kpca-nys-block" in k for k in keys) >= 12 * m.n_passes_
    np.testing.assert_array_equal(m.landmark_indices_, ref.landmark_indices_)
    np.testing.assert_allclose(m.eigenvalues_, ref.eigenvalues_, rtol=1e-12)
    np.testing.assert_allclose(m.projection_, ref.projection_, atol=1e-10)
    np.testing.assert_allclose(emb, ref_emb, atol=1e-9)
    new = X[:40] + 0.1
    np.testing.assert_allclose(m.transform(new), ref.transform(new), atol=1e-9)
