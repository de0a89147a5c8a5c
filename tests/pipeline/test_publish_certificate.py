"""The solve stage publishes on the certificate (issue 29, decision 1).

A fit that carries a certificate is published when every pair meets the level it was
certified to; ``solver.max_residual`` bounds the residuals of pairs certified as vectors
or subspaces, not the raw residuals of "eigenvalue only" pairs (a flat tail), whose
eigenvalues are certified by Weyl's bound to ``tail_tol`` (1 %). Fits without a
certificate (dense, arpack, Nyström's covariance method) keep ``max_residual`` on every
residual. Real fits through ``pipeline.model.solve.solve`` (no mocks); docs/solvers.md, "What
you can rely on".
"""

import logging
import re

import dask.array as da
import numpy as np
import pytest
from scipy.sparse.linalg import eigsh
from sklearn.datasets import make_blobs
from sklearn.metrics.pairwise import rbf_kernel

from pipeline.config import load_config
from pipeline.model.fit_check import certificate_of
from pipeline.model.solve import SolveError, check_fit, solve
from pipeline.output.store import Location

# 10 blobs in d = 64, rbf gamma = 1/64, 16 components, rows as given (scale: none): nine
# leading eigenvalues (~45) certified as subspaces, then a flat tail of seven (~3.3, relative
# gaps below 1 %) certified by their eigenvalues only, to 1 %
N, D, K, GAMMA = 3000, 64, 16, 1 / 64


def _cfg(tmp_path, scale="none", **solver):
    return load_config(
        {
            "input": {"path": str(tmp_path / "x.npy")},
            "kernel": {"name": "rbf", "gamma": GAMMA},
            "preprocess": {"scale": scale},
            "solver": {
                "n_components": K,
                "eigen_solver": "randomized",
                "dtype": "float64",
                **solver,
            },
        }
    )


def _old_rule_refuses(est, lim):
    """The check before issue 29's decision 1: every pair's residual ``r = residuals_ *
    lambda`` against ``lim * lambda`` plus the rounding level."""
    lam = np.abs(est.eigenvalues_)
    tau = est.solver_info_["certificate"]["rounding_level"]
    return np.flatnonzero(est.residuals_ * lam > lim * lam + tau)


@pytest.fixture(scope="module")
def blobs():
    return make_blobs(N, n_features=D, centers=10, random_state=0)[0]


def test_certified_flat_tail_above_max_residual_is_published(blobs, tmp_path, caplog):
    """The flat tail's raw residuals exceed ``solver.max_residual`` but its certificate
    holds: published. Measured (Intel Xeon, AVX-512, 2026-11-27): 11 passes, components 10-16
    "eigenvalue only" with residuals 2.3e-3 to 7.1e-3 against max_residual = 1e-3, the
    nine before them "subspace" with residuals ~1e-15; the check before this change
    refused the fit (components 10-16 above 1e-3 * lambda + tau, tau = 5.6e-13). The
    published eigenvalues are within their certified bounds of ARPACK's (``eigsh``) on
    the centred kernel matrix (the tail's true errors are ~1e-5)."""
    lim = 1e-3
    cfg = _cfg(tmp_path, max_residual=lim)
    with caplog.at_level(logging.INFO, logger="pipeline"):
        est, info = solve(
            da.from_array(blobs, chunks=(1000, -1)), cfg, Location(str(tmp_path / "m"))
        )
    cert = est.solver_info_["certificate"]
    kinds = cert["certified"]
    tail = [i for i, kind in enumerate(kinds) if kind == "eigenvalue only"]
    assert est.converged_ and cert["ok"] and len(tail) >= 3
    # the old rule would have refused it, on tail pairs only
    refused = _old_rule_refuses(est, lim)
    assert len(refused) and set(refused) <= set(tail)
    assert np.max(est.residuals_[tail]) > 2 * lim
    # ... and the pairs with certified vectors are far inside max_residual
    head = [i for i in range(K) if i not in tail]
    assert np.max(est.residuals_[head]) < 1e-6
    # published: the model is saved, the manifest's record says what each pair is
    assert (tmp_path / "m").is_dir()
    assert info["certificate"]["certified"] == kinds
    assert info["certificate"]["eigenvalue_levels"][tail[0]] == pytest.approx(1e-2)
    line = [r.getMessage() for r in caplog.records if "eigenvalues only" in r.getMessage()]
    assert len(line) == 1 and f"above solver.max_residual={lim:g}" in line[0]
    assert f"{tail[0] + 1}-{tail[-1] + 1}" in line[0]
    # what the certificate promises holds against a dense reference
    Kc = rbf_kernel(blobs, gamma=GAMMA)
    Kc -= Kc.mean(axis=0)
    Kc -= Kc.mean(axis=1)[:, None]
    # ARPACK to machine precision (issue 29: accuracy is measured against ARPACK; it
    # agrees with scipy.linalg.eigh here to 3e-15, at a fifth of the time)
    ref = np.sort(eigsh(Kc, k=K, which="LA", tol=0, v0=np.ones(N))[0])[::-1]
    theta = est.eigenvalues_
    bound = np.asarray(cert["eigenvalue_bounds"]) * theta + cert["rounding_level"]
    assert np.all(np.abs(theta - ref) <= bound + 1e-12 * ref[0])
    assert np.all(theta <= ref * (1 + 1e-12))  # Ritz values never overshoot


def test_failed_certificate_is_refused_naming_the_pair(blobs, tmp_path):
    """One pass and no oversampling: the certificate does not hold. Refused in one line
    naming the pair, its bound and level, and what to change; nothing saved."""
    cfg = _cfg(tmp_path, n_power_iter=0, n_oversamples=0, n_components=4)
    with pytest.raises(SolveError) as err:
        solve(da.from_array(blobs, chunks=(1000, -1)), cfg, Location(str(tmp_path / "m")))
    msg = str(err.value)
    assert "\n" not in msg
    assert "certificate does not hold after 2 passes: component 1 of 4" in msg
    m = re.search(r"eigenvalue bound (\S+) \(relative\) above its level (\S+) ", msg)
    assert m and float(m.group(1)) > float(m.group(2)) > 0, msg
    assert "set solver.n_power_iter: auto" in msg and "eigen_solver: dense" in msg
    assert not (tmp_path / "m").exists()


@pytest.fixture(scope="module")
def scaled_fit(blobs, tmp_path_factory):
    """The same rows standard-scaled (the pipeline's default): pairs 1-15 are certified as
    vectors or subspaces, several with residuals far above the rounding level (1e-7 to
    1e-5 relative), the 16th alone is a flat tail."""
    tmp = tmp_path_factory.mktemp("scaled")
    cfg = _cfg(tmp, scale="standard")
    est, _ = solve(da.from_array(blobs, chunks=(1000, -1)), cfg, Location(str(tmp / "m")))
    return est, cfg


def test_max_residual_still_bounds_certified_vectors(scaled_fit):
    """``solver.max_residual`` below a certified vector's residual refuses the fit, naming
    that pair; "eigenvalue only" pairs are never the one named."""
    est, cfg = scaled_fit
    cert = certificate_of(est)
    kinds = cert["certified"]
    vec = [i for i, kind in enumerate(kinds) if kind != "eigenvalue only"]
    r, lam, tau = est.residuals_, est.eigenvalues_, cert["rounding_level"]
    worst = max(vec, key=lambda i: r[i])
    assert cert["ok"] and r[worst] * lam[worst] > 100 * tau
    cfg.solver.max_residual = float(r[worst]) * 2
    check_fit(est, cfg)
    cfg.solver.max_residual = float(r[worst]) / 2
    with pytest.raises(SolveError) as err:
        check_fit(est, cfg)
    msg = str(err.value)
    assert f"for component {worst + 1} of {K} (certified as {kinds[worst]!r})" in msg
    assert "exceeds solver.max_residual" in msg and "lower solver.tol" in msg
    # null turns the accuracy checks off
    cfg.solver.max_residual = None
    check_fit(est, cfg)


def test_a_fit_without_certificate_keeps_max_residual_on_every_pair(blobs, tmp_path):
    """Dense: exact to rounding, no certificate; its residuals are judged as before."""
    cfg = _cfg(tmp_path, eigen_solver="dense", n_components=4)
    X = blobs[:600]
    est, info = solve(da.from_array(X, chunks=(300, -1)), cfg, Location(str(tmp_path / "m")))
    assert certificate_of(est) is None and info["certificate"] is None
    r = float(np.max(est.residuals_))
    assert 0 < r < 1e-10
    cfg.solver.max_residual = r / 10
    with pytest.raises(SolveError, match=r"the dense solver's residual .* exceeds solver\."):
        check_fit(est, cfg)


def test_mixed_precision_is_judged_on_the_float64_recertification():
    """Float64 rows, defaults, n >= 8192: float32 blocks, then one pass on the kernel in
    float64 that certifies the pairs. The certificate the pipeline judges is that one
    (``solver_info_["certificate"]``, rounding level of float64), not the float32
    iteration's (``solver_info_["mixed_precision"]["iteration_certificate"]``)."""
    import kpca_dask

    X = make_blobs(8192, n_features=D, centers=10, random_state=0)[0]
    est = kpca_dask.KernelPCA(K, kernel="rbf", gamma=GAMMA).fit(X)
    info = est.solver_info_
    assert info["mixed_precision"]["blocks"] == "float32"
    cert = certificate_of(est)
    assert cert is info["certificate"]
    it = info["mixed_precision"]["iteration_certificate"]
    assert cert["rounding_level"] < 1e-3 * it["rounding_level"]
    assert "eigenvalue only" in cert["certified"]
    cfg = load_config(
        {
            "input": {"path": "x.npy"},
            "kernel": {"name": "rbf", "gamma": GAMMA},
            "solver": {"n_components": K, "dtype": "float64", "max_residual": 1e-3},
        }
    )
    tail = [i for i, kind in enumerate(cert["certified"]) if kind == "eigenvalue only"]
    assert np.max(est.residuals_[tail]) > 1e-3  # the old rule refused it
    check_fit(est, cfg)
