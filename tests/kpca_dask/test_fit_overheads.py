"""The fixed costs of a fit (issue 29): no ``import distributed`` without a client, no
float32 certification pass under mixed precision (the float64 one certifies), and the
cache fill's subnormal flush on the values' bits."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import dask
import numpy as np
import pytest
from sklearn.datasets import make_blobs

from kpca_dask import KernelPCA
from kpca_dask.block_products import _flush_subnormal, cache_block, kernel_block
from kpca_dask.cost import Cluster
from kpca_dask.kernels import make_kernel
from kpca_dask.resources import _scheduler_kind

TINY = np.finfo(np.float32).tiny


def _run(code: str) -> dict:
    """``code`` in a fresh interpreter (this tree's modules, as the tests import them);
    its last line of output, parsed as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------- import distributed
@pytest.mark.cluster  # a fresh Python process
def test_fit_without_a_client_does_not_import_distributed():
    """Fits of every exact tier and Nyström, numpy and dask input, mixed precision,
    transform (numpy rows, and the graph of dask rows) and fit_transform: ``distributed``
    stays unimported (dask's own ``get_scheduler`` and ``rechunk`` import it to look for a
    client)."""
    got = _run(
        """
        import json, sys
        import numpy as np, dask.array as da
        from kpca_dask import KernelPCA
        X = np.random.default_rng(0).standard_normal((400, 5))
        runs = []
        for kw in [{}, {"eigen_solver": "randomized"}, {"eigen_solver": "arpack"},
                   {"eigen_solver": "nystroem", "n_landmarks": 60},
                   {"eigen_solver": "randomized", "block_dtype": "float32"},
                   {"eigen_solver": "randomized", "kernel_cache": "recompute"}]:
            for x in (X, da.from_array(X, chunks=150)):
                m = KernelPCA(3, kernel="rbf", gamma=0.2, random_state=0, **kw).fit(x)
                runs.append([m.converged_, m.solver_info_["executed"]])
        m.transform(X[:7]); m.fit_transform(X)
        lazy = m.transform(da.from_array(X, chunks=150))  # built, NaN-checked, not computed
        assert lazy.chunks[0] == (150, 150, 100)
        print(json.dumps({"distributed": "distributed" in sys.modules, "runs": runs}))
        """
    )
    assert got["distributed"] is False
    assert all(ok for ok, _ in got["runs"])
    assert all("no distributed client" in why for _, why in got["runs"])


@pytest.mark.cluster  # a fresh Python process
def test_scheduler_kind_without_distributed_matches_dask():
    """Without ``distributed`` imported, ``_scheduler_kind`` reads dask's config as
    ``dask.base.get_scheduler`` does: the same answers as after importing it (when
    ``get_scheduler`` itself decides), and its errors for "distributed" without a
    client and for an unknown name."""
    got = _run(
        """
        import json, sys
        import dask, dask.local
        from concurrent.futures import ThreadPoolExecutor
        from kpca_dask.resources import _scheduler_kind

        def kinds(settings):
            out = []
            for s in settings:
                with dask.config.set(scheduler=s):
                    try:
                        kind, client = _scheduler_kind()
                        out.append([kind, client is None])
                    except Exception as exc:
                        out.append(["error", type(exc).__name__])
            return out
        with ThreadPoolExecutor(1) as pool:
            ok = [None, "sync", "Threads", "processes", "single-threaded",
                  dask.local.get_sync, pool]
            before = kinds(ok)
            imported = "distributed" in sys.modules
            errors = kinds(["distributed", "nonsense"])  # get_scheduler raises
            import distributed  # now get_scheduler decides every case
            after = kinds(ok)
        print(json.dumps({"before": before, "after": after, "imported": imported,
                          "errors": errors}))
        """
    )
    assert got["imported"] is False
    assert got["before"] == got["after"]
    local, other = ["local", True], ["other", True]
    assert got["before"] == [local, local, local, other, local, local, other]
    assert got["errors"] == [["error", "RuntimeError"], ["error", "ValueError"]]


def test_with_a_client_the_distributed_path_is_taken(dask_client):
    assert _scheduler_kind() == ("distributed", dask_client)
    X = np.random.default_rng(1).normal(size=(300, 4))
    m = KernelPCA(3, kernel="rbf", gamma=0.3, eigen_solver="randomized").fit(X)
    assert m.solver_info_["executed"].startswith("cluster")
    assert "workers" in m.solver_info_["kernel_cache"]["reason"]


def test_config_scheduler_is_respected_without_a_client():
    """A scheduler set in dask's config is the fit's: the synchronous one runs every
    task in this thread (so a task sees no dask worker thread)."""
    import threading

    seen = set()

    def spy(dsk, keys, **kw):
        seen.add(threading.get_ident())
        return dask.local.get_sync(dsk, keys, **kw)

    X = np.random.default_rng(2).normal(size=(200, 3))
    with dask.config.set(scheduler=spy):
        m = KernelPCA(2, kernel="rbf", gamma=0.3, eigen_solver="randomized").fit(X)
    assert seen == {threading.get_ident()}
    assert m.converged_


# ------------------------------------------------------- mixed precision's passes
def test_mixed_precision_spends_no_float32_certification_pass():
    """The float32 iteration ends on its last pass (no certification pass of its own);
    the one float64 pass certifies. Every pass is timed, and the cost model prices the
    same number of passes with the float64 one last."""
    X = make_blobs(2000, n_features=16, centers=6, random_state=0)[0]
    m = KernelPCA(
        12,
        kernel="rbf",
        gamma=1 / 16,
        eigen_solver="randomized",
        block_dtype="float32",
        random_state=0,
    )
    m.fit(X)
    assert m.block_dtype_ == "float32" and m.converged_
    info = m.solver_info_
    assert info["finish"] == "last_pass"
    assert len(info["pass_seconds"]) == m.n_passes_
    it = info["mixed_precision"]["iteration_certificate"]
    assert it["ok"]  # the float32 iteration stopped on its own certificate
    est = m.plan(X).estimate(
        Cluster(workers=1, threads=2, memory=16 << 30, distributed=False),
        passes=m.n_passes_,
        kernel_cache="memory",
    )
    priced = [(s.name, s.count) for s in est.stages if "pass" in s.name]
    assert sum(c for _, c in priced) == m.n_passes_
    assert priced[-1] == ("certifying pass (float64)", 1)


# ------------------------------------------------------------------ the flush
def _reference_flush(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out[np.abs(out) < TINY] = 0.0
    return out


def test_flush_zeroes_subnormals_only():
    vals = np.array(
        [TINY, TINY / 2, -TINY / 4, -TINY, 1e-45, -1e-45, 0.0, -0.0, 1.0, -3.5, np.inf, -np.inf]
        + [np.nextafter(TINY, 0, dtype=np.float32), np.nan],
        dtype=np.float32,
    )
    got = _flush_subnormal(vals.copy())
    np.testing.assert_array_equal(got, _reference_flush(vals))
    assert not np.any((got != 0) & (np.abs(got) < TINY))
    # larger than one chunk, and a strided (non-contiguous) view
    rng = np.random.default_rng(0)
    big = (rng.standard_normal(700_001) * np.exp(-rng.uniform(0, 110, 700_001))).astype(
        np.float32
    )
    assert np.count_nonzero((big != 0) & (np.abs(big) < TINY)) > 1000
    np.testing.assert_array_equal(_flush_subnormal(big.copy()), _reference_flush(big))
    m = big[:700_000].reshape(700, 1000)
    view = m.copy()[:, ::3]
    np.testing.assert_array_equal(_flush_subnormal(view), _reference_flush(m[:, ::3]))
    f64 = np.array([1e-40, 1.0])
    assert _flush_subnormal(f64.copy()).tolist() == f64.tolist()  # float32 only


@pytest.mark.parametrize(
    "kernel, params", [("rbf", {"gamma": 0.5}), ("sigmoid", {"gamma": 2.0})]
)
def test_cache_block_is_the_kernel_block_flushed(kernel, params):
    """Strip by strip (float64 evaluation rounded to float32) and whole (float32): the
    cached block is the kernel block with its subnormals zeroed, nothing else changed;
    negative kernel values (sigmoid) keep their sign."""
    rng = np.random.default_rng(3)
    X = np.vstack([rng.normal(size=(300, 4)), rng.normal(size=(300, 4)) + 7.0])
    k = make_kernel(kernel, **params)
    for ev in (np.float64, None):
        blk = kernel_block(k, X[:250], X, np.float32, ev)
        got = cache_block(k, X[:250], X, np.float32, ev)
        assert got.dtype == np.float32 and got.shape == (250, 600)
        np.testing.assert_array_equal(got, _reference_flush(blk))
        if kernel == "rbf":
            assert np.count_nonzero((blk != 0) & (blk < TINY)) > 0  # there was work to do
    b64 = cache_block(k, X[:50], X, np.float64)
    np.testing.assert_array_equal(b64, kernel_block(k, X[:50], X, np.float64))


def test_recertify_takes_the_span_of_vectors_that_are_not_orthonormal():
    """recertify's bounds take V orthonormal: vectors of the same span that are not
    (scaled, mixed) give the same eigenpairs as an orthonormal basis of it."""
    import dask.array as da

    from kpca_dask.gram import BlockKernelMatrix
    from kpca_dask.mixed import recertify

    rng = np.random.default_rng(4)
    X = rng.normal(size=(300, 4))
    K = BlockKernelMatrix(
        da.from_array(X, chunks=(100, 4)), make_kernel("rbf", gamma=0.3), "f8"
    )
    V = np.linalg.qr(rng.normal(size=(300, 5)))[0]
    skew = V @ np.triu(rng.uniform(0.5, 2.0, size=(5, 5)))
    kw = dict(tol=1e-8, rounded=False, had_tail=False)
    a, b = recertify(K, V, **kw), recertify(K, skew, **kw)
    np.testing.assert_allclose(b["eigenvalues"], a["eigenvalues"], rtol=1e-12)
    Vb = b["eigenvectors"]
    np.testing.assert_allclose(Vb.T @ Vb, np.eye(5), atol=1e-12)
