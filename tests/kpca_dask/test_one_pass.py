"""kpca_dask.one_pass.transform: the transform of a dask array in one read of it, the
NaN/inf check inside the blocks' tasks (an error when computed, never a silent result)."""

from __future__ import annotations

import threading

import dask
import dask.array as da
import numpy as np
import pytest
from sklearn.decomposition import KernelPCA as SkKernelPCA

from kpca_dask import InvalidInputError, KernelPCA, one_pass


class _CountingReads:
    """An array-like whose every slice is counted (what a store's chunk reads are)."""

    def __init__(self, a: np.ndarray):
        self.a, self.shape, self.dtype, self.ndim = a, a.shape, a.dtype, a.ndim
        self.reads = 0
        self._lock = threading.Lock()

    def __getitem__(self, key):
        with self._lock:
            self.reads += 1
        return self.a[key]


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(3)
    centres = rng.normal(scale=6.0, size=(4, 5))
    return centres[rng.integers(0, 4, 4000)] + rng.normal(size=(4000, 5))


@pytest.mark.parametrize("solver", ["dense", "randomized", "nystroem"])
def test_the_same_embedding_as_transform_with_one_read_of_each_block(blobs, solver):
    m = KernelPCA(n_components=4, kernel="rbf", gamma=0.05, eigen_solver=solver, random_state=0)
    m.fit(blobs[:1500])
    src = _CountingReads(blobs)
    Xd = da.from_array(src, chunks=(500, 5), asarray=True)
    src.reads = 0  # from_array's look at a 0 x 0 slice
    with dask.config.set(scheduler="threads"):
        ref = m.transform(Xd).compute()
        two_reads, src.reads = src.reads, 0
        got = one_pass.transform(m, Xd).compute()
        one_read = src.reads
    nblocks = 8
    assert two_reads == 2 * nblocks  # transform: the NaN pass, then the graph
    assert one_read == nblocks
    np.testing.assert_array_equal(got, ref)
    if solver == "dense":  # and what an independent implementation gives
        sk = SkKernelPCA(n_components=4, kernel="rbf", gamma=0.05).fit(blobs[:1500])
        want = sk.transform(blobs)
        signs = np.sign(np.sum(want * got, axis=0))
        np.testing.assert_allclose(got * signs, want, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_nonfinite_value_raises_when_computed_naming_its_row_column_and_value(blobs, bad):
    m = KernelPCA(n_components=3, kernel="rbf", gamma=0.05, eigen_solver="nystroem")
    m.fit(blobs[:1000])
    X = blobs.copy()
    X[2345, 2] = bad
    X[2346, 4] = bad
    lazy = one_pass.transform(m, da.from_array(X, chunks=(500, 5)))  # no pass yet
    with pytest.raises(InvalidInputError) as err:
        lazy.compute(scheduler="threads")
    msg = str(err.value)
    assert "2 value(s) in rows 2000-2499" in msg
    assert f"row 2345, column 2, value {float(bad)!r}" in msg
    assert "1 other column" in msg


def test_numpy_rows_are_checked_up_front_as_transform_does(blobs):
    m = KernelPCA(n_components=3, kernel="rbf", gamma=0.05).fit(blobs[:500])
    X = blobs[:50].copy()
    X[7, 1] = np.nan
    with pytest.raises(InvalidInputError, match="NaN or infinity"):
        one_pass.transform(m, X)
    np.testing.assert_array_equal(one_pass.transform(m, blobs[:50]), m.transform(blobs[:50]))
