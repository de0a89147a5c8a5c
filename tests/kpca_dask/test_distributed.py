"""The same fit on a real multi-process distributed cluster as on the threaded scheduler."""

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import get_task_stream
from sklearn.datasets import make_blobs

from kpca_dask import KernelPCA

pytestmark = pytest.mark.distributed

X, _ = make_blobs(1200, n_features=6, centers=8, random_state=3)


@pytest.mark.parametrize("solver", ["randomized", "dense"])
def test_distributed_equals_threaded(dask_client, solver):
    kw = dict(
        kernel="rbf",
        gamma=0.02,
        eigen_solver=solver,
        random_state=0,
        n_power_iter=4,
        chunk_size=300,
    )
    with dask.config.set(scheduler="threads"):  # threaded reference, client bypassed
        ref = KernelPCA(5, **kw).fit(X)
    with get_task_stream(dask_client) as stream:
        m = KernelPCA(5, **kw).fit(X)  # the client is the default scheduler here
    ran_on = {t["worker"] for t in stream.data}
    assert len(ran_on) == 2, "the work did not run on both worker processes"
    if solver == "randomized":
        assert any("kpca-kz-part" in str(t["key"]) for t in stream.data)
    np.testing.assert_allclose(m.eigenvalues_, ref.eigenvalues_, rtol=1e-12)
    np.testing.assert_allclose(m.eigenvectors_, ref.eigenvectors_, atol=1e-10)
    new = X[:40] + 0.1
    np.testing.assert_allclose(m.transform(new), ref.transform(new), atol=1e-10)


def test_workers_are_separate_processes(dask_client):
    import os

    pids = set(dask_client.run(os.getpid).values())
    assert len(pids) == 2 and os.getpid() not in pids


def test_the_models_rows_go_to_the_workers_once_not_in_every_graph(dask_client, tmp_path):
    """A model whose training rows are above distributed's 10 MiB large-graph threshold
    (1800 x 800 float64 = 11 MiB): transform and score_samples of lazy input send graphs
    that name the scattered rows (no "Sending large graph" warning, three calls in a row),
    scatter them once per client, and give the numbers of the in-process transform."""
    import warnings

    from kpca_dask import estimator as E

    X = np.random.default_rng(0).standard_normal((1800, 800))
    new = np.random.default_rng(1).standard_normal((600, 800))
    with dask.config.set(scheduler="threads"):  # in this process: nothing scattered
        est = KernelPCA(n_components=4, kernel="rbf", eigen_solver="dense").fit(X)
        ref, ref_scores = est.transform(new), est.score_samples(new)
    assert est.X_fit_.nbytes > 10 * 2**20
    with dask_client.as_current():
        lazy = da.from_zarr(_zarr_of(new, tmp_path))  # the workers read it: not in the graph
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs = [est.transform(lazy).compute() for _ in range(3)]
            scores = est.score_samples(lazy).compute()
    large = [str(w.message) for w in caught if "large graph" in str(w.message)]
    assert large == [], large
    assert sum(key[0] == id(dask_client) for key in E._SCATTERED) == 1
    for out in outs:
        np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-6, atol=1e-9)


def _zarr_of(a: np.ndarray, folder):
    import zarr

    z = zarr.open_array(
        str(folder / "new.zarr"),
        mode="w",
        shape=a.shape,
        chunks=(200, a.shape[1]),
        dtype=a.dtype,
    )
    z[...] = a
    return z
