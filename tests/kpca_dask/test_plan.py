"""``KernelPCA.plan(X)``: what fit will do, decided without fitting (issue 16).

The plan must be the one fit follows (solver, blocks, kernel, landmarks), refuse what
fit refuses with the same message, read no data (a sample for gamma="scale" only) and
set no attribute. The persistence layer writes and reads a model state without the
estimator.
"""

from __future__ import annotations

import subprocess
import sys

import dask.array as da
import numpy as np
import pytest
from scipy.spatial.distance import pdist
from sklearn.base import clone

from kpca_dask import InvalidInputError, InvalidParameterError, KernelPCA
from kpca_dask.persistence import ModelState, load_state, read_model_group, save_state
from kpca_dask.plan import FitPlan, auto_block_rows

RNG = np.random.default_rng(7)
X = RNG.normal(size=(2600, 5))

CONFIGS = {
    "dense-small": (KernelPCA(4, kernel="rbf", gamma=0.3), X[:400]),
    "randomized-auto": (KernelPCA(6, kernel="rbf", random_state=0), X),
    "randomized-block-covers-n": (
        KernelPCA(20, eigen_solver="randomized", kernel="poly"),
        X[:40],
    ),
    "arpack": (KernelPCA(3, eigen_solver="arpack", kernel="laplacian", gamma=0.2), X[:300]),
    "nystroem": (
        KernelPCA(
            5,
            eigen_solver="nystroem",
            n_landmarks=64,
            kernel="rbf",
            gamma="scale",
            random_state=0,
        ),
        X,
    ),
    "chunk-size": (KernelPCA(3, kernel="sigmoid", gamma=0.01, chunk_size=300), X[:900]),
    "float32": (KernelPCA(3, kernel="cosine", dtype="float32"), X[:500]),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_plan_is_what_fit_does(name):
    est, data = CONFIGS[name]
    plan = est.plan(data)
    assert isinstance(plan, FitPlan)
    m = clone(est).fit(data)
    assert plan.solver == m.eigen_solver_
    assert plan.block_rows == m.chunk_size_
    assert plan.n_blocks == -(-data.shape[0] // m.chunk_size_)
    assert (plan.n_samples, plan.n_features) == (m.n_samples_fit_, m.n_features_in_)
    assert plan.gamma == m.gamma_
    assert plan.kernel.to_dict() == m.kernel_.to_dict()
    assert plan.dtype == np.dtype(est.dtype)
    assert plan.n_landmarks == getattr(m, "n_landmarks_", None)


def test_plan_of_precomputed_kernel():
    K = X[:200] @ X[:200].T
    est = KernelPCA(3, kernel="precomputed")
    plan = est.plan(K)
    assert plan.precomputed and plan.solver == "dense" and plan.gamma is None
    assert plan.solver == clone(est).fit(K).eigen_solver_


def test_scale_gamma_is_the_median_heuristic():
    """Independent reference: 1 / (2 median of the squared distances), all rows sampled."""
    plan = KernelPCA(2, kernel="rbf", gamma="scale").plan(X[:300])
    assert plan.gamma == pytest.approx(
        1.0 / (2 * np.median(pdist(X[:300], "sqeuclidean"))), rel=1e-10
    )


def _boom(block):
    raise RuntimeError("the plan read the data")


def test_plan_reads_no_data_and_sets_nothing():
    lazy = da.zeros((60_000, 6), chunks=(5000, 6)).map_blocks(_boom, dtype=float)
    est = KernelPCA(8, kernel="rbf", gamma=0.5)
    before = dict(est.__dict__)
    plan = est.plan(lazy)
    assert est.__dict__ == before
    assert plan.solver == "nystroem" and plan.n_landmarks == 2048
    assert plan.block_rows == 7500 and plan.n_blocks == 8
    # gamma="scale" samples rows, unless the kernel is left unresolved
    scale = KernelPCA(8, kernel="rbf", gamma="scale")
    unresolved = scale.plan(lazy, kernel=False)
    assert unresolved.kernel is None and unresolved.gamma is None
    assert unresolved.solver == "nystroem"
    with pytest.raises(RuntimeError, match="read the data"):
        scale.plan(lazy)


@pytest.mark.parametrize(
    "est, data, kw, error, match",
    [
        (
            KernelPCA(None, eigen_solver="randomized"),
            X[:100],
            {},
            InvalidParameterError,
            "needs an explicit n_components",
        ),
        (
            KernelPCA(10, eigen_solver="nystroem", n_landmarks=5),
            X[:100],
            {},
            InvalidParameterError,
            "must be <= n_landmarks=5",
        ),
        (
            KernelPCA(3, eigen_solver="nystroem"),
            X[:100],
            {"centring": (np.zeros(100), 0.0)},
            InvalidParameterError,
            "never uses it",
        ),
        (KernelPCA(3, kernel="precomputed"), X[:10], {}, InvalidInputError, "square matrix"),
        (KernelPCA(300), X[:100], {}, InvalidInputError, "n_components=300 must be <="),
        (
            KernelPCA(3, preimage="fixed_point", fit_inverse_transform=True, kernel="poly"),
            X[:100],
            {},
            InvalidParameterError,
            "fixed-point iteration",
        ),
        (KernelPCA(3, gamma=-1.0, kernel="rbf"), X[:100], {}, InvalidParameterError, "gamma"),
    ],
)
def test_plan_refuses_what_fit_refuses(est, data, kw, error, match):
    with pytest.raises(error, match=match) as planned:
        est.plan(data, **kw)
    with pytest.raises(error, match=match) as fitted:
        clone(est).fit(data, **kw)
    assert str(planned.value) == str(fitted.value)


def test_auto_block_rows_balances_small_inputs():
    assert auto_block_rows(20_000) == 2000  # ~2048 rows a block below 50 000 rows
    assert auto_block_rows(100_000) == 4000  # ~4096 from 50 000 rows on
    assert -(-3000 // auto_block_rows(3000)) == 6  # at least 6 blocks when n allows
    assert auto_block_rows(300) == 300  # one block below 2 x 256 rows


@pytest.mark.cluster  # a fresh Python process
def test_persistence_is_pure_io(tmp_path):
    """A state round-trips through save_state/load_state, checksummed, with no estimator:
    importing kpca_dask.persistence loads neither the estimator nor scikit-learn."""
    code = (
        "import sys, kpca_dask.persistence; "
        "assert 'kpca_dask.estimator' not in sys.modules; "
        "assert 'sklearn' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    arrays = {
        "eigenvalues": np.array([3.0, 1.0]),
        "X_fit": X[:4],
        "eigenvectors": np.eye(4)[:, :2],
        "row_means": np.ones(4),
    }
    state = ModelState(
        kind="exact",
        params={"n_components": 2},
        kernel={"name": "linear"},
        dtype="float64",
        fitted={"n_components_": 2},
        arrays=arrays,
    )
    save_state(state, tmp_path / "m")
    back = load_state(tmp_path / "m")
    assert (back.kind, back.params, back.kernel, back.fitted, back.extra) == (
        "exact",
        {"n_components": 2},
        {"name": "linear"},
        {"n_components_": 2},
        {},
    )
    for name, a in arrays.items():
        np.testing.assert_array_equal(back.arrays[name], a)
    attrs, _ = read_model_group(tmp_path / "m")
    assert sorted(attrs["checksums"]) == sorted(arrays)
    with pytest.raises(FileExistsError):
        save_state(state, tmp_path / "m")


def test_dtype_is_public_after_fit_and_survives_save_load(tmp_path):
    """The pipeline reads the compute dtype through ``dtype_``, never a private name."""
    import kpca_dask
    from kpca_dask.exceptions import NotFittedError

    X = np.random.default_rng(0).standard_normal((60, 3))
    est = kpca_dask.KernelPCA(2, kernel="rbf", dtype="float32")
    with pytest.raises(NotFittedError):
        _ = est.dtype_
    est.fit(X)
    assert est.dtype_ == np.float32
    est.save(tmp_path / "m")
    assert kpca_dask.load(tmp_path / "m").dtype_ == np.float32
