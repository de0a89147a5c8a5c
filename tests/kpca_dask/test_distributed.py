"""The same fit on a real multi-process distributed cluster as on the threaded scheduler."""

import dask
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
