"""Never silently wrong: every solver on numerically low-rank kernels (and full-rank controls).

The sweep of issue 13: linear, cosine and poly kernels on 2-D and 3-D data (their
centred kernel matrices have rank 2, 3 or 9), rbf on data with many duplicate rows
(rank = distinct rows - 1, below and above the 16 components asked for), and rbf
on clustered / Gaussian data (full rank). For every solver (dense, randomized
block Krylov and subspace, Nyström with every row a landmark -- then it is exact
kernel PCA -- both methods, and "auto") the result must either match the
independent reference (scikit-learn's kernel matrix, ``scipy.linalg.eigh``):

* eigenvalues within 1e-6 relative (plus 1e-10 of the largest: eigenvalues at
  rounding level have no relative accuracy, for eigh neither);
* every eigenvalue above 1e-8 of the largest returned;
* embeddings within 1e-4 of their scale up to sign -- for a cluster of nearly
  equal eigenvalues (relative gaps below 1e-2) up to a rotation inside the
  cluster, since only its invariant subspace is defined; a cluster cut by
  n_components only has to lie in that subspace;
* a flat tail that n_components cuts (relative gaps below 5 %; the
  certificate's ``tail_start``) is certified by its eigenvalues only (issue
  17): each within its certified bound (at most the tail level, 1 %), and the
  reported residuals are the true ones (``check_tail``);

or say that it does not (``converged_`` False and a ConvergenceWarning). In
this sweep every solver in fact gets there (asserted too).
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import scipy.linalg
from sklearn.datasets import make_blobs, make_circles, make_moons
from sklearn.metrics.pairwise import pairwise_kernels

from kpca_dask import ConvergenceWarning, KernelPCA
from kpca_dask import plan as plan_module
from kpca_dask.exceptions import DroppedComponentsWarning

K = 16
N = 400
CLUSTER_RTOL = 1e-2  # the solver's default for tol=1e-8: min(0.05, 100 * sqrt(tol))


def _moons():
    return make_moons(N, noise=0.05, random_state=0)[0]


def _circles():
    return make_circles(N, noise=0.05, factor=0.5, random_state=0)[0]


def _gauss3():
    return np.random.default_rng(0).standard_normal((N, 3))


def _duplicates(distinct):
    base = np.random.default_rng(1).standard_normal((distinct, 5))
    return np.repeat(base, N // distinct, axis=0)


def _ring():
    """Equally spaced points on a circle: a circulant kernel matrix, its eigenvalues
    in exactly equal pairs (the Fourier modes cos and sin of each frequency)."""
    t = 2 * np.pi * np.arange(N) / N
    return np.c_[np.cos(t), np.sin(t)]


def _blobs():
    return make_blobs(N, n_features=8, centers=10, random_state=0)[0]


POLY = dict(kernel="poly", gamma=1.0, degree=3, coef0=1.0)
#: name -> (data, kernel parameters); the rank of the centred kernel matrix in the name
CASES = {
    "moons-poly-rank9": (_moons, POLY),
    "circles-poly-rank9": (_circles, POLY),
    "moons-linear-rank2": (_moons, dict(kernel="linear")),
    "circles-cosine-rank2": (_circles, dict(kernel="cosine")),
    "gauss3d-poly2-rank9": (_gauss3, dict(kernel="poly", gamma=1 / 3, degree=2, coef0=1.0)),
    "gauss3d-linear-rank3": (_gauss3, dict(kernel="linear")),
    "gauss3d-cosine-rank3": (_gauss3, dict(kernel="cosine")),
    "rbf-10-distinct-rows-rank9": (
        functools.partial(_duplicates, 10),
        dict(kernel="rbf", gamma=0.2),
    ),
    "rbf-40-distinct-rows-rank39": (
        functools.partial(_duplicates, 40),
        dict(kernel="rbf", gamma=0.2),
    ),
    "ring-rbf-equal-pairs": (_ring, dict(kernel="rbf", gamma=1.0)),
    "ring-rbf-equal-pairs-cut": (_ring, dict(kernel="rbf", gamma=1.0, n_components=K - 1)),
    "full-rank-blobs-rbf": (_blobs, dict(kernel="rbf", gamma=0.01)),
    "full-rank-gauss3d-rbf": (_gauss3, dict(kernel="rbf", gamma=0.5)),
}

SOLVERS = {
    "dense": dict(eigen_solver="dense"),
    "block_krylov": dict(eigen_solver="randomized", randomized_method="block_krylov"),
    "subspace": dict(eigen_solver="randomized", randomized_method="subspace", max_iter=60),
    "nystroem-covariance": dict(
        eigen_solver="nystroem",
        n_landmarks=N,
        landmark_method="uniform",
        nystroem_method="covariance",
    ),
    "nystroem-randomized": dict(
        eigen_solver="nystroem",
        n_landmarks=N,
        landmark_method="uniform",
        nystroem_method="randomized",
    ),
    "auto": dict(eigen_solver="auto"),
}


@functools.cache
def reference(case: str):
    """X, the parameters, and eigh's top-K eigenpairs of the centred kernel matrix
    (scikit-learn's kernel functions: independent of kpca_dask.kernels)."""
    make, params = CASES[case]
    X = make()
    skw = {k: v for k, v in params.items() if k not in ("kernel", "n_components")}
    Kx = pairwise_kernels(X, metric=params["kernel"], **skw)
    n = Kx.shape[0]
    H = np.eye(n) - 1.0 / n
    Kc = H @ Kx @ H
    w, V = scipy.linalg.eigh((Kc + Kc.T) / 2)
    w, V = w[::-1], V[:, ::-1]
    return X, params, w, V


def clusters(w: np.ndarray) -> list[tuple[int, int]]:
    """Runs [a, b) of nearly equal eigenvalues (relative gaps below CLUSTER_RTOL)."""
    out, a = [], 0
    for i in range(1, len(w) + 1):
        if i == len(w) or w[i - 1] - w[i] > CLUSTER_RTOL * abs(w[i - 1]):
            out.append((a, i))
            a = i
    return out


def fit(case: str, solver: str, **extra):
    X, params, _, _ = reference(case)
    params = {"n_components": K, **params}
    m = KernelPCA(random_state=0, **params, **SOLVERS[solver], **extra)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        E = m.fit_transform(X)
    return m, np.asarray(E, dtype=np.float64), caught


def check_right(m: KernelPCA, E: np.ndarray, case: str) -> None:
    """The result matches the reference (see the module docstring)."""
    _, params, w, V = reference(case)
    k = params.get("n_components", K)
    top = w[0]
    lam = m.eigenvalues_
    kept = lam.shape[0]
    must = int(np.count_nonzero(w[:k] > 1e-8 * top))
    assert kept >= must, f"only {kept} components returned, {must} eigenvalues exist"
    assert kept <= k
    # A flat tail cut by n_components (randomized solvers: the certificate's
    # tail_start) is certified by its eigenvalues only, to the tail tolerance.
    cert = (getattr(m, "solver_info_", None) or {}).get("certificate") or {}
    tail = cert.get("tail_start")
    tail = kept if tail is None else min(int(tail), kept)
    np.testing.assert_allclose(lam[:tail], w[:tail], rtol=1e-6, atol=1e-10 * top)
    if tail < kept:
        check_tail(m, case, tail)
    Eref = V[:, :kept] * np.sqrt(np.maximum(w[:kept], 0))
    scale = np.abs(Eref).max()
    for a, b in clusters(w[: K + 8]):
        if a >= tail:
            break
        if b > tail:  # reaches into the tail: only its part above the tail is certified
            B = V[:, a:b]
            part = E[:, a:tail]
            d = np.abs(part - B @ (B.T @ part)).max()
            assert d <= 1e-4 * scale, f"cluster {a}-{b} (tail): off its subspace by {d:.1e}"
            continue
        if w[a] <= 1e-8 * top:
            continue  # rounding-level eigenvalues: their vectors are noise for eigh too
        if b <= kept and b - a == 1:
            j = a
            d = min(np.abs(E[:, j] - Eref[:, j]).max(), np.abs(E[:, j] + Eref[:, j]).max())
            assert d <= 1e-4 * scale, f"component {j}: embedding off by {d / scale:.1e}"
        elif b <= kept:  # a whole cluster: equal up to a rotation inside it
            U, _, Wt = np.linalg.svd(E[:, a:b].T @ Eref[:, a:b])
            d = np.abs(E[:, a:b] @ (U @ Wt) - Eref[:, a:b]).max()
            assert d <= 1e-4 * scale, f"cluster {a}-{b}: embedding off by {d / scale:.1e}"
        else:  # cut by n_components: the returned part lies in the cluster's subspace
            B = V[:, a:b]
            part = E[:, a:kept]
            d = np.abs(part - B @ (B.T @ part)).max()
            assert d <= 1e-4 * scale, f"cluster {a}-{b} (cut): off its subspace by {d:.1e}"


def check_tail(m: KernelPCA, case: str, tail: int) -> None:
    """The certified claims about a flat tail hold against the reference: every
    eigenvalue within its certified bound (itself within the tail tolerance), and
    (randomized solver: residuals of Kc itself) the reported residuals are the
    true ones, so each vector lies within ``r / delta`` of the eigenvectors whose
    eigenvalues are within ``delta`` of its own."""
    _, _, w, V = reference(case)
    cert = m.solver_info_["certificate"]
    lam = m.eigenvalues_
    kept = lam.shape[0]
    bounds = np.array(cert["eigenvalue_bounds"][tail:kept])
    levels = np.array(cert["eigenvalue_levels"][tail:kept])
    assert np.all(bounds <= levels + cert["rounding_level"] / lam[tail:kept])
    err = np.abs(lam[tail:kept] - w[tail:kept]) / lam[tail:kept]
    slack = (cert["rounding_level"] + 1e-10 * w[0]) / lam[tail:kept]  # eigh's rounding too
    assert np.all(err <= bounds + slack), (err, bounds)
    assert set(cert["certified"][tail:kept]) == {"eigenvalue only"}
    if m.eigen_solver_ == "randomized":
        Vt = m.eigenvectors_[:, tail:kept].astype(np.float64)
        R = V @ (w[:, None] * (V.T @ Vt)) - Vt * lam[tail:kept]  # Kc v - theta v
        r = np.linalg.norm(R, axis=0)
        np.testing.assert_allclose(
            r, m.residuals_[tail:kept] * lam[tail:kept], rtol=1e-3, atol=1e-9 * w[0]
        )


@pytest.mark.parametrize("solver", list(SOLVERS))
@pytest.mark.parametrize("case", list(CASES))
def test_right_or_says_so(case, solver):
    m, E, caught = fit(case, solver)
    kinds = {w.category for w in caught}
    unexpected = kinds - {ConvergenceWarning, DroppedComponentsWarning}
    assert not unexpected, [str(w.message) for w in caught]
    _, params, w, _ = reference(case)
    if m.n_components_ < params.get(
        "n_components", K
    ):  # fewer than asked: the user is told, as for dense
        assert DroppedComponentsWarning in kinds
    if not m.converged_:
        assert ConvergenceWarning in kinds  # says so ...
        pytest.fail(
            f"{solver} did not converge on {case}"
        )  # ... but here it should not need to
    assert ConvergenceWarning not in kinds
    check_right(m, E, case)


def test_rank_below_k_returns_the_existing_pairs_only():
    """Rank 2 (linear kernel, 2-D data), 16 asked: the randomized solver finds two
    pairs and certifies them (exact: the Krylov space is exhausted) in a few passes.
    The estimator then follows scikit-learn, like dense: the missing pairs are zero
    eigenvalues with zero columns, dropped with ``remove_zero_eig=True``."""
    m, E, caught = fit("moons-linear-rank2", "block_krylov")
    d, Ed, _ = fit("moons-linear-rank2", "dense")
    assert m.solver_info_["rank_found"] == 2 and m.solver_info_["exhausted"]
    assert m.n_passes_ <= 4
    assert m.converged_
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert m.n_components_ == d.n_components_ == K
    assert np.all(m.eigenvalues_[2:] == 0) and np.all(E[:, 2:] == 0)
    np.testing.assert_allclose(m.eigenvalues_, d.eigenvalues_, rtol=1e-6, atol=1e-10)
    np.testing.assert_allclose(np.abs(E), np.abs(Ed), atol=1e-4 * np.abs(Ed).max())
    for solver in ("block_krylov", "dense"):
        r, _, _ = fit("moons-linear-rank2", solver, remove_zero_eig=True)
        assert r.n_components_ == 2


def test_certificate_bounds_hold_on_a_low_rank_kernel():
    """The certified eigenvalue and angle bounds are true bounds (against eigh)."""
    m, _, _ = fit("circles-poly-rank9", "block_krylov")
    _, _, w, V = reference("circles-poly-rank9")
    cert = m.solver_info_["certificate"]
    k = len(cert["eigenvalue_bounds"])
    err = np.abs(m.eigenvalues_[:k] - w[:k]) / w[:k]
    assert np.all(err <= np.array(cert["eigenvalue_bounds"]) + 1e-14)
    ids = np.array(cert["clusters"])
    for c in np.unique(ids):
        idx = np.flatnonzero(ids == c)
        ang = scipy.linalg.subspace_angles(m.eigenvectors_[:, idx], V[:, idx]).max()
        assert np.sin(ang) <= max(cert["angle_bounds"][i] for i in idx) + 1e-12


def test_too_few_passes_is_never_silent():
    """Two passes on a full-rank spectrum cannot be certified: converged_ is False,
    a ConvergenceWarning (also scikit-learn's class) says so, residuals show it."""
    from sklearn.exceptions import ConvergenceWarning as SkConvergenceWarning

    m, _, caught = fit("full-rank-blobs-rbf", "block_krylov", n_power_iter=1)
    assert not m.converged_
    msgs = [w for w in caught if issubclass(w.category, SkConvergenceWarning)]
    assert msgs and "did not certify" in str(msgs[0].message)
    assert "eigen_solver='dense'" in str(msgs[0].message)
    assert m.residuals_.max() > 1e-6


def _bigger():
    X = make_blobs(2100, n_features=8, centers=10, random_state=0)[0]
    return X


def test_auto_escalates_to_dense_when_small():
    """auto on 2000 < n <= 5000 picks randomized; capped at one pass it cannot
    certify, so it falls back to dense: right, converged, no warning."""
    X = _bigger()
    m = KernelPCA(8, kernel="rbf", gamma=0.01, eigen_solver="auto", max_iter=1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.fit(X)
    assert m.eigen_solver_ == "dense" and m.converged_
    assert m.solver_info_["escalated_from"]["n_passes"] == 2
    d = KernelPCA(8, kernel="rbf", gamma=0.01, eigen_solver="dense").fit(X)
    np.testing.assert_allclose(m.eigenvalues_, d.eigenvalues_, rtol=1e-12)


def test_auto_escalates_to_a_larger_block_then_warns(monkeypatch):
    """Above the dense fallback size, auto retries with a larger block and more passes;
    if that is still not certified, it warns (saying it escalated)."""
    monkeypatch.setattr(plan_module, "DENSE_FALLBACK_SAMPLES", 1000)
    X = _bigger()
    ok = KernelPCA(8, kernel="rbf", gamma=0.01, eigen_solver="auto", max_iter=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok.fit(X)  # 3 passes of 8 + 16 columns fail; twice the oversampling passes
    assert ok.eigen_solver_ == "randomized" and ok.converged_
    assert ok.solver_info_["escalated_from"]["n_passes"] == 4
    assert ok.solver_info_["block_columns"] == 8 + 2 * ok.n_oversamples == 8 + 32
    bad = KernelPCA(
        8, kernel="rbf", gamma=0.01, eigen_solver="auto", max_iter=1, random_state=0
    )
    with pytest.warns(ConvergenceWarning, match="after escalating"):
        bad.fit(X)
    assert not bad.converged_


def test_nystroem_fewer_landmarks_than_components_on_low_rank_data():
    """Data with 10 distinct rows (rank 9), 16 components, 20 landmarks: the landmark
    methods that adapt (rpcholesky, kmeans++) find the 10 distinct rows, the
    Nyström problem is then exact and the 9 pairs equal eigh's; the rest are
    zero eigenvalues with zero columns (scikit-learn's contract), never noise, and
    ``remove_zero_eig=True`` drops them."""
    X, params, _, _ = reference("rbf-10-distinct-rows-rank9")
    for lm in ("rpcholesky", "kmeans++"):
        for method in ("covariance", "randomized"):
            m = KernelPCA(
                K,
                **params,
                eigen_solver="nystroem",
                n_landmarks=20,
                landmark_method=lm,
                nystroem_method=method,
                random_state=0,
            )
            E = np.asarray(m.fit_transform(X))
            assert m.converged_ and m.n_components_ == K
            assert np.all(m.eigenvalues_[9:] == 0)
            assert np.abs(E[:, 9:]).max() <= 1e-12 * np.abs(E).max()  # rounding of the offset
            r = KernelPCA(
                K,
                **params,
                eigen_solver="nystroem",
                n_landmarks=20,
                landmark_method=lm,
                nystroem_method=method,
                random_state=0,
                remove_zero_eig=True,
            )
            with pytest.warns(DroppedComponentsWarning, match="Kept 9 of 16"):
                Er = np.asarray(r.fit_transform(X))
            assert r.n_components_ == 9
            check_right(r, Er, "rbf-10-distinct-rows-rank9")


def test_nystroem_auto_method_escalates_to_covariance():
    """nystroem_method="auto" picked randomized (many landmarks) but one pass cannot be
    certified: the covariance method (exact eigh of the feature covariance) takes over."""
    X = make_blobs(1200, n_features=4, centers=6, random_state=2)[0]
    m = KernelPCA(
        4,
        kernel="rbf",
        gamma=0.1,
        eigen_solver="nystroem",
        n_landmarks=1200,
        landmark_method="uniform",
        n_oversamples=4,
        max_iter=1,
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.fit(X)
    assert m.nystroem_method_ == "covariance" and m.converged_
    assert m.solver_info_["escalated_from"]["n_passes"] >= 1


@pytest.mark.parametrize(
    "case",
    [
        "moons-poly-rank9",
        "rbf-10-distinct-rows-rank9",
        "ring-rbf-equal-pairs",
        "full-rank-blobs-rbf",
    ],
)
def test_float32_kernel_evaluation_is_as_right_as_dense_float32(case):
    """float32 kernel values: the randomized solver certifies its pairs (tol 1e-5) and its
    eigenvalues are as close to float64 eigh as dense eigh on the same float32 kernel
    (within 1e-5 relative plus 1e-7 of the largest: the rounding of the kernel)."""
    m, _, caught = fit(case, "block_krylov", dtype="float32")
    d, _, _ = fit(case, "dense", dtype="float32")
    assert m.converged_ and not any(w.category is ConvergenceWarning for w in caught)
    _, _, w, _ = reference(case)
    k = m.n_components_
    assert k == d.n_components_
    top = w[0]
    err_m = np.abs(m.eigenvalues_ - w[:k])
    err_d = np.abs(d.eigenvalues_ - w[:k])
    assert np.all(err_m <= 1e-5 * w[:k] + 1e-7 * top + 10 * err_d)
