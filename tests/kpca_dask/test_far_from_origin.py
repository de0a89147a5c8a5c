"""Kernels exact far from the origin (issue 29): rows shifted by a large constant.

Distance-based kernels are evaluated on rows minus the training mean, so the expanded
squared distance cancels within the spread, not the offset. The reference is always
independent: ``scipy.linalg.eigh`` of the centred kernel matrix computed in float64 by
explicit differences on the UNSHIFTED rows (or, for float32 input, on the rows the
float32 values represent, shifted back exactly in float64), never by our code.

Before the fix (n = 1500, d = 8, gamma = 0.2): float32 input at offset 1e3 had top-4
eigenvalue errors of 2.1e-2, at 1e4 of 10 (garbage), float64 at 1e8 of 3.4, every
solver, with ``converged_=True`` and no warning.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg

from kpca_dask import AsymmetricKernelWarning, KernelPCA, PrecisionWarning, load
from kpca_dask.kernels import LaplacianKernel, RBFKernel
from kpca_dask.precision import INPUT_STEP_WARN

N, D, GAMMA, K = 700, 8, 0.2, 4
SOLVERS = ["dense", "arpack", "randomized", "nystroem"]


def reference(X: np.ndarray, gamma: float, k: int = K, kind: str = "rbf") -> np.ndarray:
    """Top-k eigenvalues of the centred kernel matrix, by differences, in float64."""
    X = np.asarray(X, dtype=np.float64)
    diff = X[:, None, :] - X[None, :, :]
    if kind == "rbf":
        Km = np.exp(-gamma * np.einsum("ijk,ijk->ij", diff, diff))
    else:
        Km = np.exp(-gamma * np.abs(diff).sum(axis=-1))
    n = Km.shape[0]
    H = np.eye(n) - 1.0 / n
    return scipy.linalg.eigh(H @ Km @ H, eigvals_only=True)[::-1][:k]


def normal_rows(n: int = N, d: int = D, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d))


def clustered_rows(n: int = N, d: int = D, c: int = 5, seed: int = 1) -> np.ndarray:
    """c well separated blobs: the leading c - 1 eigenvalues stand apart (gapped)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(c, d))
    return centres[rng.integers(c, size=n)] + 0.5 * rng.standard_normal((n, d))


def fit(X, solver, **kw):
    extra = {"n_landmarks": X.shape[0], "nystroem_method": "covariance"}
    params = dict(
        n_components=K,
        kernel="rbf",
        gamma=GAMMA,
        eigen_solver=solver,
        random_state=0,
        **(extra if solver == "nystroem" else {}),
    )
    params.update(kw)
    return KernelPCA(**params).fit(X)


def certified_error(est: KernelPCA) -> np.ndarray:
    """What the solver promises per eigenvalue (absolute): the randomized certificate's
    bounds, else nothing beyond rounding (dense, ARPACK, Nyström covariance)."""
    cert = (est.solver_info_ or {}).get("certificate") or {}
    b = cert.get("eigenvalue_bounds")
    return np.zeros(len(est.eigenvalues_)) if b is None else np.asarray(b)[:K]


def check(est: KernelPCA, ref: np.ndarray, rtol: float = 1e-6, certified=True) -> None:
    """Every eigenvalue within ``rtol`` relative of the reference, plus (``certified``)
    the solver's own certified bound: the certificate's promise, on the true kernel."""
    w = np.asarray(est.eigenvalues_)
    err = np.abs(w - ref)
    assert est.converged_
    allowed = rtol * ref + (certified_error(est) if certified else 0.0)
    assert np.all(err <= allowed), (w, ref, err / ref)


# ------------------------------------------------------------------------ the kernel
def test_centred_kernel_is_the_same_function_and_exact_far_away():
    X = normal_rows(50)
    plain, centred = RBFKernel(GAMMA), RBFKernel(GAMMA).with_center(X.mean(axis=0))
    np.testing.assert_allclose(centred(X), plain(X), rtol=1e-13, atol=1e-15)
    direct = np.exp(-GAMMA * ((X[:, None] - X[None]) ** 2).sum(-1))
    far = RBFKernel(GAMMA).with_center((X + 1e8).mean(axis=0))
    np.testing.assert_allclose(far(X + 1e8), direct, rtol=0, atol=1e-7)
    # without the centre the expanded form is garbage there: what the fix removes
    assert np.max(np.abs(plain(X + 1e8) - direct)) > 0.1
    # float32 evaluation: the centre is subtracted in float64, before the cast
    np.testing.assert_allclose(far(X + 1e8, dtype=np.float32), direct, atol=2e-6)
    lap = LaplacianKernel(0.3).with_center(X.mean(axis=0) + 1e8)
    ref = np.exp(-0.3 * np.abs(X[:, None] - X[None]).sum(-1))
    np.testing.assert_allclose(lap(X + 1e8), ref, atol=1e-7)
    # equality and to_dict ignore the centre (same kernel); dask tokens do not
    from dask.base import tokenize

    assert centred == plain and centred.to_dict() == plain.to_dict()
    assert tokenize(centred) != tokenize(plain)
    with pytest.raises(ValueError, match="centred on 8 features"):
        centred(X[:, :3])


# -------------------------------------------------------------- every solver, offsets
@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(
    "dtype,offset", [(np.float64, 1e8), (np.float64, 1e4), (np.float32, 30.0)]
)
def test_eigenvalues_far_from_origin_match_unshifted_reference(solver, dtype, offset):
    """No warning, and every eigenvalue within 1e-6 relative (plus the randomized
    solver's own certified bound) of the float64 reference on the unshifted rows."""
    X0 = normal_rows()
    Xs = (X0 + offset).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no PrecisionWarning: the promise holds
        est = fit(Xs, solver)
    check(est, reference(Xs.astype(np.float64) - offset, GAMMA))  # the rows as given
    check(est, reference(X0, GAMMA))  # and the unshifted original (float32: 30 spreads)
    # the centre: the training mean in float64, on a grid of 2^-12 of each range
    X64 = Xs.astype(np.float64)
    span = X64.max(axis=0) - X64.min(axis=0)
    assert np.all(np.abs(est.kernel_.center - X64.mean(axis=0)) <= span / 8192)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("offset", [1e3, 1e4])
def test_float32_input_far_from_origin_warns_and_is_exact_for_its_values(solver, offset):
    """float32 values near 1e4 vary in steps of 1e-3: no solver can undo that. The fit
    warns, naming the cause, and is exact (1e-6) for the rows the float32 values are; its
    error against the unshifted original is within the ratio the warning states."""
    X0 = normal_rows()
    Xs = (X0 + offset).astype(np.float32)
    with pytest.warns(PrecisionWarning, match="float32 keeps them to steps of") as rec:
        est = fit(Xs, solver)
    assert "pass the data as float64" in str(rec[0].message)
    represented = Xs.astype(np.float64) - offset  # exact in float64
    check(est, reference(represented, GAMMA))
    span = X0.max(axis=0) - X0.min(axis=0)
    ratio = float(np.max(np.finfo(np.float32).eps / 2 * np.abs(Xs).max(axis=0) / span))
    assert ratio > INPUT_STEP_WARN
    check(est, reference(X0, GAMMA), rtol=ratio)


@pytest.mark.parametrize("solver", SOLVERS)
def test_clustered_data_far_from_origin(solver):
    """Blobs (the gapped leading eigenvalues) at offset 1e8, float64: within 1e-6."""
    X0 = clustered_rows()
    est = fit(X0 + 1e8, solver, gamma=0.05)
    check(est, reference(X0, 0.05), certified=False)


def test_float32_compute_far_from_origin():
    """dtype='float32' (float32 kernel blocks) on float64 rows at 1e8: the centre is taken
    before the cast, so the result is float32-accurate, not garbage."""
    X0 = normal_rows()
    est = fit(X0 + 1e8, "dense", dtype="float32")
    check(est, reference(X0, GAMMA), rtol=1e-4)


def test_laplacian_far_from_origin():
    X0 = normal_rows(400)
    est = KernelPCA(K, kernel="laplacian", gamma=0.3, eigen_solver="dense").fit(X0 + 1e8)
    check(est, reference(X0, 0.3, kind="laplacian"))


def test_gamma_scale_far_from_origin():
    """The median heuristic's distances are taken on centred rows too."""
    X0 = normal_rows(400)
    a = KernelPCA(K, kernel="rbf", gamma="scale", random_state=0).fit(X0)
    b = KernelPCA(K, kernel="rbf", gamma="scale", random_state=0).fit(X0 + 1e8)
    assert b.gamma_ == pytest.approx(a.gamma_, rel=1e-8)
    np.testing.assert_allclose(b.eigenvalues_, a.eigenvalues_, rtol=1e-6)


# ----------------------------------------------- the fitted centre: new rows, saving
@pytest.mark.parametrize("solver", ["dense", "nystroem"])
def test_new_rows_saved_model_and_preimages_far_from_origin(tmp_path, solver):
    """transform, score_samples, the fixed-point pre-image and a saved/loaded model see
    the same centre: shifted rows embed as the unshifted ones do."""
    X0 = normal_rows(400)
    new0 = normal_rows(30, seed=5)
    kw = dict(fit_inverse_transform=True, preimage="fixed_point")
    a = fit(X0, solver, **kw)
    b = fit(X0 + 1e8, solver, **kw)
    Za, Zb = a.transform(new0), b.transform(new0 + 1e8)
    np.testing.assert_allclose(Zb, Za, atol=1e-6 * np.abs(Za).max())
    np.testing.assert_allclose(
        b.score_samples(new0 + 1e8), a.score_samples(new0), rtol=1e-6, atol=1e-9
    )
    # the learned start is scikit-learn's ridge map (no intercept: not shift-equivariant,
    # by scikit-learn's definition), so compare the fixed points where both converged
    Pa, sa = a.inverse_transform(Za, return_status=True)
    Pb, sb = b.inverse_transform(Zb, return_status=True)
    ok = (sa == 0) & (sb == 0)
    assert ok.sum() >= 10
    np.testing.assert_allclose(Pb[ok] - 1e8, Pa[ok], atol=1e-4)
    b.save(tmp_path / "m")
    m = load(tmp_path / "m")
    np.testing.assert_array_equal(m.kernel_.center, b.kernel_.center)
    np.testing.assert_array_equal(m.transform(new0 + 1e8), Zb)


def test_nystroem_partial_fit_far_from_origin():
    """An exact Nyström update evaluates the new rows with the training centre (uniform
    landmarks: randomly pivoted Cholesky may pick other, equally good, ones when rounding
    differs in the last bits)."""
    X0 = normal_rows(600)
    kw = dict(n_landmarks=200, keep_statistics=True, landmark_method="uniform")
    a = fit(X0[:300], "nystroem", **kw).partial_fit(X0[300:])
    b = fit(X0[:300] + 1e8, "nystroem", **kw).partial_fit(X0[300:] + 1e8)
    np.testing.assert_array_equal(a.landmark_indices_, b.landmark_indices_)
    np.testing.assert_allclose(b.eigenvalues_, a.eigenvalues_, rtol=1e-6)


def test_unshifted_data_unchanged_by_centring():
    """Centring changes nothing beyond rounding for data near the origin: the fit equals
    the float64 reference as before (scikit-learn parity is tested in test_vs_sklearn)."""
    X0 = normal_rows()
    est = fit(X0, "dense")
    np.testing.assert_allclose(est.eigenvalues_, reference(X0, GAMMA), rtol=1e-12)


# ------------------------------------------------------------ precomputed symmetry
def _kernel_matrix(n: int = 200) -> np.ndarray:
    X = normal_rows(n)
    return np.exp(-GAMMA * ((X[:, None] - X[None]) ** 2).sum(-1))


@pytest.mark.parametrize("solver", ["dense", "randomized"])
def test_asymmetric_precomputed_kernel_is_symmetrised_with_a_warning(solver):
    Km = _kernel_matrix()
    rng = np.random.default_rng(3)
    bad = Km + 0.05 * rng.standard_normal(Km.shape)
    with pytest.warns(AsymmetricKernelWarning, match=r"\(K \+ K\.T\) / 2"):
        est = KernelPCA(K, kernel="precomputed", eigen_solver=solver, random_state=0).fit(bad)
    sym = KernelPCA(K, kernel="precomputed", eigen_solver=solver, random_state=0).fit(
        (bad + bad.T) / 2
    )
    np.testing.assert_allclose(est.eigenvalues_, sym.eigenvalues_, rtol=1e-10)


def test_precomputed_kernel_symmetric_to_rounding_is_silent():
    Km = _kernel_matrix()
    ulp = np.spacing(np.abs(Km).max())
    noisy = Km + np.triu(np.full_like(Km, 3 * ulp), 1)  # a GEMM's rounding, not an error
    assert np.max(np.abs(noisy - noisy.T)) > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KernelPCA(K, kernel="precomputed", eigen_solver="dense").fit(noisy)


# ------------------------------------------------- what cannot be met is said
def test_feature_space_offset_warns_where_rounding_exceeds_tol():
    """Polynomial and linear kernels are not translation invariant: far from the origin
    their values dwarf the centred spectrum. Near the origin: silent; far: a
    PrecisionWarning naming the ratio and the fix."""
    X0 = normal_rows(200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KernelPCA(K, kernel="poly", gamma=1 / D, eigen_solver="dense").fit(X0)
        KernelPCA(K, kernel="linear", eigen_solver="dense", dtype="float32").fit(X0)
    with pytest.warns(PrecisionWarning, match=r"trace\(K\) / trace\(Kc\).*preprocess"):
        KernelPCA(K, kernel="poly", gamma=1 / D, eigen_solver="dense", dtype="float32").fit(
            X0 + 100.0
        )
    with pytest.warns(PrecisionWarning, match=r"linear kernel's values are 1\.\d+e\+08 times"):
        KernelPCA(K, kernel="linear", eigen_solver="dense").fit(X0 + 1e4)
