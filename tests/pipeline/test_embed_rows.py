"""Batch inference in one place (pipeline/embed/transform.py: embed_rows), checked against the
model's own transform and scikit-learn's KernelPCA."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from sklearn.decomposition import KernelPCA as SkKernelPCA

from kpca_dask import KernelPCA
from pipeline.embed.transform import embed_rows

RNG = np.random.default_rng(3)
X = RNG.standard_normal((300, 5))
SPLIT = (RNG.random(300) > 0.25).astype(np.uint8)  # 1 = training row


@pytest.fixture(scope="module")
def exact():
    return KernelPCA(4, kernel="rbf", gamma=0.2, eigen_solver="dense").fit(X[SPLIT == 1])


def _abs(a):  # component signs are a convention: compare up to sign per column
    return np.abs(np.asarray(a))


def test_training_rows_come_from_the_fit_held_out_rows_from_transform(exact):
    Xd = da.from_array(X, chunks=64)
    emb = embed_rows(exact, Xd, split=SPLIT)
    assert emb.chunks[0] == Xd.chunks[0]
    E = emb.compute()
    fit = exact.eigenvectors_ * np.sqrt(exact.eigenvalues_)
    np.testing.assert_array_equal(E[SPLIT == 1], fit)  # no kernel evaluated for them
    np.testing.assert_allclose(
        E[SPLIT == 0], np.asarray(exact.transform(X[SPLIT == 0])), rtol=1e-10, atol=1e-12
    )
    sk = SkKernelPCA(4, kernel="rbf", gamma=0.2, eigen_solver="dense").fit(X[SPLIT == 1])
    np.testing.assert_allclose(
        _abs(E[SPLIT == 1]), _abs(sk.transform(X[SPLIT == 1])), atol=1e-8
    )
    np.testing.assert_allclose(
        _abs(E[SPLIT == 0]), _abs(sk.transform(X[SPLIT == 0])), atol=1e-8
    )


def test_a_subset_of_rows_in_batches(exact):
    Xd = da.from_array(X, chunks=64)
    idx = np.array([0, 5, 7, 100, 101, 250, 299])
    emb = embed_rows(exact, Xd, split=SPLIT, idx=idx, batch_rows=3)
    assert emb.chunks[0] == (3, 3, 1)
    full = embed_rows(exact, Xd, split=SPLIT).compute()
    np.testing.assert_allclose(emb.compute(), full[idx], rtol=1e-10, atol=1e-12)


def test_new_data_goes_through_transform(exact):
    new = RNG.standard_normal((50, 5))
    emb = embed_rows(exact, da.from_array(new, chunks=20), training_data=False)
    assert emb.chunks == ((20, 20, 10), (4,))
    np.testing.assert_allclose(
        emb.compute(), np.asarray(exact.transform(new)), rtol=1e-10, atol=1e-12
    )
