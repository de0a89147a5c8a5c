# long: the panel store, its operations and the solve on them read together (one protocol)
"""The block Krylov basis row-distributed on the workers (issue 38).

With the per-worker driver (:mod:`kpca_dask.worker_passes`, ``kpca.exact-driver:
workers``) the randomized block Krylov solve keeps every ``n``-row array on the workers:
the basis ``W``, the products ``Kc Q``, the Ritz vectors and the row means. Each worker
holds the rows of its panel (panel ``p``: the rows of a run of whole row blocks, on worker
``p``, as :meth:`~kpca_dask.worker_passes.WorkerPasses.panel_bounds` cuts them) in a
store in its process (:data:`_STORE`), and the caller sends small programs
(:func:`run_ops`, by ``Client.run``: no scheduler tasks) whose results are small: Gram
matrices ``A_p^T B_p`` (summed over the panels in panel order by the caller: ``L x c``),
column sums, and R factors (``c x c`` a panel, for TSQR). The caller holds ``O(L^2)``
numbers a pass; its per-pass work does not grow with ``n``.

Orthonormalisation (:meth:`PanelBasis.orth`): CholQR2 on the row panels (Gram by a sum of
the panels' Grams, Cholesky on the caller, ``R^-1`` sent back, each panel multiplied);
when a Cholesky factorisation fails or the result is not orthonormal to ``1e-10``, shifted
CholQR3 (Fukaya, Kannan, Nakatsukasa, Yamamoto and Yanagisawa, "Shifted Cholesky QR for
computing the QR factorization of ill-conditioned matrices", SIAM J. Sci. Comput. 42(1),
2020: Cholesky of ``G + s I`` with ``s = 11 (m c + c (c + 1)) u ||X||_2^2``, then
CholQR2), and when that fails too, TSQR (the panels' R factors stacked and factored on
the caller, an SVD of the result; directions below ``eps`` of the largest are dropped).
The rank-revealing orthonormalisation of a new block (directions below the rounding level
``tau`` dropped) is CholQR2 when the block's Gram matrix resolves its singular values (as
:func:`~kpca_dask.solvers.krylov_basis._rank_revealing_orth`), else TSQR plus the SVD of
its R factor: the same decisions as the caller-side basis, on small matrices.

The iteration, the certificate and the certification pass are those of
:func:`kpca_dask.solvers.randomized.randomized_eigh` (``method="block_krylov"``), with
the same first block (drawn on the caller a panel at a time from the same stream: the
same numbers as the whole draw) and the same centring; results agree with the caller-side
basis to rounding. Only the final vectors (``n x k``) and the row means (``n``) are
gathered, once, at the end.

Per pass: the product's tasks (a task per panel publishing its block, the share tasks,
the tree of sums, ``ceil(P / 4)`` cut tasks and a task per panel storing the result) and
about six ``Client.run`` round trips (centring and ``W^T Y``; two of CGS2; two of CholQR2;
the residual's ``Q_next^T Y``), each ``O(L c)`` numbers a panel.

Limits: a lost worker loses its panels: the fit stops with one :class:`BasisLostError`
naming it and its rows (the per-worker driver's resident rows are recomputed elsewhere,
the basis is not); subspace iteration and mixed precision
keep the basis on the caller.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import numpy as np
import scipy.linalg
from dask.base import tokenize

from .exceptions import BasisLostError, ConvergenceWarning
from .solvers._common import EigResult, deterministic_signs
from .solvers.certificate import certify, not_converged_message
from .solvers.krylov_basis import COND_CHOLQR
from .solvers.randomized_setup import (
    _generator,
    _n_existing,
    _rayleigh_ritz,
    _settings,
    _start_vectors,
    _tail_level,
)

logger = logging.getLogger("kpca_dask")

#: dask config key: whether the block Krylov basis stays on the workers with the
#: per-worker driver (default True; False: on the caller, as with the waves driver).
BASIS_CONFIG = "kpca.worker-basis"

#: Per worker process: ``(store, worker address) -> {name: panel array}``.
_STORE: dict[tuple[str, str], dict[str, Any]] = {}


def _addr(dask_worker: Any) -> str:
    return str(getattr(dask_worker, "address", ""))


def _here(store: str) -> dict[str, Any]:
    from distributed import get_worker

    return _STORE.setdefault((store, _addr(get_worker())), {})


# ---- on the workers ----


def publish(store: str, src: str, shift: np.ndarray, ones: bool, dtype: str) -> np.ndarray:
    """The panel ``src - shift`` (and a column of ones) in the products' dtype (a task)."""
    A = _here(store)[src]
    out = A - shift
    if ones:
        out = np.hstack([out, np.ones((A.shape[0], 1))])
    return np.ascontiguousarray(out, dtype=dtype)


def pick_blocks(parts: dict[int, np.ndarray], blocks: list[int]) -> dict[int, np.ndarray]:
    """The row blocks ``blocks`` of a sum (a task cutting the root for a group of panels)."""
    return {b: parts[b] for b in blocks if b in parts}


def store_rows(
    store: str,
    dst: str,
    parts: dict[int, np.ndarray],
    local: dict[int, int],
    rows: int,
    ones: bool,
    n: int,
) -> list[np.ndarray]:
    """Keep the panel's rows of a product as ``dst`` (and the row means ``mu`` from its
    column of ones); returns the column sums (and the sum of ``mu``)."""
    st = _here(store)
    c = next(iter(parts.values())).shape[1]
    Y = np.zeros((rows, c), dtype=np.float64, order="F")
    for b, a in local.items():
        y = parts.get(b)
        if y is not None:
            Y[a : a + y.shape[0]] = y
    out = []
    if ones:
        st["mu"] = Y[:, -1] / n
        Y = np.asfortranarray(Y[:, :-1])
        out.append(np.array([st["mu"].sum()]))
    st[dst] = Y
    out.insert(0, Y.sum(axis=0))
    return out


def _get(st: dict[str, Any], name: str, cols: int | None = None) -> np.ndarray:
    if name == "W":
        W = st["W"][:, : st["width"]]
        return W if cols is None else W[:, :cols]
    return st[name]


def run_ops(store: str, ops: list[tuple], dask_worker: Any = None) -> list[Any]:
    """Run a small program on this worker's panel (by ``Client.run``); its outputs in order.

    Ops: ``("put", name, array)``, ``("sub_mean", name, m)`` (``A -= m``), ``("tn", a, b)``
    (``A^T B``), ``("colsum", a)``, ``("proj", dst, src, S)`` (``src - W[:, :L] S``),
    ``("mul", dst, src, T)`` (``src @ T``; ``src`` ``"W"``: its first ``T.shape[0]``
    columns), ``("lincomb", dst, [(src, T), ...])``, ``("qr_r", a)``, ``("append", a)``
    (to ``W``), ``("reset", a)`` (``W = a``), ``("get", a)``, ``("drop", a)``."""
    st = _STORE.setdefault((store, _addr(dask_worker)), {})
    out: list[Any] = []
    for op in ops:
        kind = op[0]
        if kind == "put":
            st[op[1]] = np.asfortranarray(op[2], dtype=np.float64)
        elif kind == "sub_mean":
            st[op[1]] = st[op[1]] - op[2]
        elif kind == "tn":
            A, B = _get(st, op[1]), _get(st, op[2])
            out.append(A.T @ B)
        elif kind == "colsum":
            out.append(_get(st, op[1]).sum(axis=0))
        elif kind == "proj":
            S = op[3]
            src = _get(st, op[2])
            st[op[1]] = src - _get(st, "W", S.shape[0]) @ S if S.size else src.copy()
        elif kind == "mul":
            T = op[3]
            src = _get(st, op[2], T.shape[0] if op[2] == "W" else None)
            st[op[1]] = np.asfortranarray(src @ T)
        elif kind == "lincomb":
            acc = None
            for src, T in op[2]:
                term = _get(st, src) @ T
                acc = term if acc is None else acc + term
            st[op[1]] = acc
        elif kind == "qr_r":
            A = _get(st, op[1])
            out.append(np.linalg.qr(A, mode="r") if A.shape[0] else np.zeros((0, A.shape[1])))
        elif kind in ("append", "reset"):
            A = st[op[1]]
            if kind == "reset" or "W" not in st:
                st["W"] = np.empty((A.shape[0], max(1, 4 * A.shape[1])), order="F")
                st["width"] = 0
            w0, w1 = st["width"], st["width"] + A.shape[1]
            if w1 > st["W"].shape[1]:
                grown = np.empty((A.shape[0], 2 * w1), order="F")
                grown[:, :w0] = st["W"][:, :w0]
                st["W"] = grown
            st["W"][:, w0:w1] = A
            st["width"] = w1
        elif kind == "get":
            out.append(_get(st, op[1]))
        elif kind == "drop":
            st.pop(op[1], None)
        else:  # pragma: no cover - a programming error
            raise ValueError(f"unknown panel op {kind!r}")
    return out


def drop_store(store: str, dask_worker: Any = None) -> None:
    """Forget a store's panels on this worker."""
    _STORE.pop((store, _addr(dask_worker)), None)


# ---- on the caller ----

#: outputs summed over the panels (the others are listed in panel order)
_SUMMED = {"tn", "colsum"}


class PanelBasis:
    """The caller's handle on the panels of one solve: runs programs on every panel and
    merges their small outputs, and multiplies by the centred kernel."""

    def __init__(self, K: Any):
        self.K = K
        self.wp = K.worker_passes()
        self.client = self.wp.client
        bounds = self.wp.panel_bounds()
        offsets = self.wp.offsets()
        self.P = len(bounds) - 1
        self.rows = [int(offsets[bounds[p + 1]] - offsets[bounds[p]]) for p in range(self.P)]
        self.workers = self.wp.workers[: self.P]
        self.n = int(K.n)
        self.store = "kpca-basis-" + tokenize(self.wp.token, time.time_ns())
        self.round_trips = 0
        self.products = 0
        self.pass_seconds: list[float] = []
        self.cols: dict[str, int] = {}

    def run(self, ops: list[tuple]) -> list[Any]:
        """``ops`` on every panel; the outputs summed (Grams, column sums) or listed."""
        self.round_trips += 1
        got = self._run_on(self.workers, ops)
        per = [got[w] for w in self.workers]
        kinds = [op[0] for op in ops if op[0] in ("tn", "colsum", "qr_r", "get")]
        merged: list[Any] = []
        for i, kind in enumerate(kinds):
            if kind in _SUMMED:
                acc = per[0][i]
                for r in per[1:]:
                    acc = acc + r[i]
                merged.append(acc)
            else:
                merged.append([r[i] for r in per])
        return merged

    def put_rows(self, name: str, fill) -> None:
        """``fill(p, rows)`` -> the panel's rows of ``name`` (one panel at a time)."""
        for p, w in enumerate(self.workers):
            self._run_on([w], [("put", name, fill(p, self.rows[p]))])

    def _run_on(self, workers: list[str], ops: list[tuple]) -> dict[str, Any]:
        """``run_ops`` on ``workers`` by ``Client.run``; a lost worker (its connection
        closed, refused or timed out; or its panel gone: restarted at the same address) is
        one :class:`BasisLostError` naming it and its rows, never a partial answer."""
        try:
            got = self.client.run(run_ops, self.store, ops, workers=workers)
            missing = [w for w in workers if w not in got]
        except (OSError, KeyError) as exc:
            self._lost(exc)
        if missing:
            self._lost(KeyError(missing))
        return got

    def _lost(self, exc: BaseException) -> None:
        try:
            alive = set(self.client.scheduler_info(n_workers=-1)["workers"])
        except Exception:  # noqa: BLE001 - the scheduler is gone too: name them all
            alive = set()
        lost = [p for p, w in enumerate(self.workers) if w not in alive] or list(range(self.P))
        starts = np.cumsum([0, *self.rows])
        who = "; ".join(
            f"{self.workers[p]} (rows {starts[p]}-{starts[p + 1] - 1})" for p in lost
        )
        raise BasisLostError(
            f"lost the Dask worker(s) holding part of the solver's Krylov basis during the "
            f"fit: {who} ({type(exc).__name__}: {exc}); the basis cannot be rebuilt from the "
            "other workers, so the fit stopped. Run it again (a pipeline run resumes at the "
            "solve), or set kpca.worker-basis: false to keep the basis on the client."
        ) from exc

    def gather(self, name: str) -> np.ndarray:
        """The whole array (the result's gather, at the end)."""
        (parts,) = self.run([("get", name)])
        return np.concatenate(parts, axis=0)

    def close(self) -> None:
        try:
            self.client.run(drop_store, self.store, workers=self.workers)
        except Exception:  # pragma: no cover - a lost worker: nothing left to drop
            pass

    # centred kernel products

    def centred_product(self, src: str, dst: str, colsum: np.ndarray) -> None:
        """``dst = H K H src`` on the panels (``colsum``: ``src``'s column sums); the first
        call also keeps the row means ``mu`` and the grand mean."""
        t0 = time.perf_counter()
        first = self.products == 0
        outs = self.wp.product_resident(self.store, src, dst, colsum / self.n, ones=first)
        self.products += 1
        ysum = sum(o[0] for o in outs)
        if first:
            self.grand_mean = float(sum(o[1][0] for o in outs) / self.n)
        self._after_product = ysum / self.n  # applied by the next program (fused)
        self.pass_seconds.append(time.perf_counter() - t0)

    # orthonormalisation

    def orth(self, name: str, G: np.ndarray | None = None, shift_ok: bool = True) -> int:
        """Orthonormalise the panels' ``name`` in place: CholQR2, else shifted CholQR3,
        else TSQR (module docstring). Returns its columns (fewer only in the TSQR
        fallback, for numerically dependent columns); ``shift_ok=False``: plain CholQR2
        only (raises ``LinAlgError`` where it fails: tests)."""
        c = self.cols[name]
        if c == 0:
            return 0
        try:
            if self._cholqr(name, G, passes=2):
                return c
        except np.linalg.LinAlgError:
            if not shift_ok:
                raise
        if not shift_ok:
            raise np.linalg.LinAlgError("CholQR2 result not orthonormal")
        logger.info("worker basis: CholQR2 failed on %d columns; shifted CholQR3", c)
        try:
            if self._shifted_cholqr3(name):
                return c
        except np.linalg.LinAlgError:
            pass
        logger.info("worker basis: shifted CholQR3 failed; TSQR")
        return self._tsqr(name, drop=0.0)

    def _cholqr(self, name: str, G: np.ndarray | None, passes: int) -> bool:
        c = self.cols[name]
        eye = np.eye(c)
        if G is None:
            (G,) = self.run([("tn", name, name)])
        for _ in range(passes):
            C = np.linalg.cholesky((G + G.T) / 2)
            Cinv = scipy.linalg.solve_triangular(C, eye, lower=True, check_finite=False)
            (G,) = self.run([("mul", name, name, Cinv.T), ("tn", name, name)])
        return bool(np.isfinite(G).all() and np.abs(G - eye).max() < 1e-10)

    def _shifted_cholqr3(self, name: str) -> bool:
        c = self.cols[name]
        (G,) = self.run([("tn", name, name)])
        G = (G + G.T) / 2
        norm2 = float(max(np.linalg.eigvalsh(G)[-1], 0.0))
        u = np.finfo(np.float64).eps / 2
        s = 11.0 * (self.n * c + c * (c + 1)) * u * norm2
        C = np.linalg.cholesky(G + s * np.eye(c))
        Cinv = scipy.linalg.solve_triangular(C, np.eye(c), lower=True, check_finite=False)
        (G,) = self.run([("mul", name, name, Cinv.T), ("tn", name, name)])
        return self._cholqr(name, G, passes=2)

    def _tsqr(self, name: str, drop: float) -> int:
        """TSQR: ``name`` times ``V S^-1`` over the kept directions of its R factor's SVD
        (singular values above ``drop``, and above ``eps c`` of the largest), then CholQR2
        (its rounding, ``eps ||R|| / s_min``, is far below 1 there). Returns the columns."""
        (rs,) = self.run([("qr_r", name)])
        Rt = np.linalg.qr(np.vstack(rs), mode="r")
        _, s, Vt = np.linalg.svd(Rt)
        floor = max(drop, s[0] * np.finfo(np.float64).eps * max(1, len(s))) if s.size else 0
        keep = s > floor
        T = Vt.T[:, keep] / s[keep]
        self.run([("mul", name, name, T)])
        self.cols[name] = int(keep.sum())
        if self.cols[name]:
            self._cholqr(name, None, passes=2)
        return self.cols[name]

    def rank_revealing_orth(
        self, name: str, G: np.ndarray, tau: float
    ) -> tuple[int, float, bool]:
        """As :func:`~kpca_dask.solvers.krylov_basis._rank_revealing_orth` on the panels:
        (columns kept, largest dropped singular value, well conditioned)."""
        c = self.cols[name]
        if c == 0:
            return 0, 0.0, True
        s2 = np.linalg.eigvalsh((G + G.T) / 2)
        smax = float(np.sqrt(max(s2[-1], 0.0)))
        if smax <= tau:
            self.cols[name] = 0
            return 0, smax, False
        if s2[0] > s2[-1] / COND_CHOLQR**2 and np.sqrt(max(s2[0], 0.0)) > 10.0 * tau:
            return self.orth(name, G), 0.0, True
        (rs,) = self.run([("qr_r", name)])
        Rt = np.linalg.qr(np.vstack(rs), mode="r")
        _, s, Vt = np.linalg.svd(Rt)
        keep = s > tau
        dropped = float(s[~keep].max()) if (~keep).any() else 0.0
        self.run([("mul", name, name, Vt.T[:, keep] / s[keep])])
        self.cols[name] = int(keep.sum())
        return self.cols[name], dropped, False


def panel_krylov_eigh(
    K: Any,
    n_components: int,
    *,
    n_oversamples: int,
    n_power_iter: int | str = "auto",
    method: str = "block_krylov",
    tol: float = 1e-7,
    max_passes: int = 20,
    psd: bool = True,
    eps: float = float(np.finfo(np.float64).eps),
    random_state: Any = None,
    warn: bool = True,
    v0: np.ndarray | None = None,
    max_basis: int | None = None,
) -> tuple[EigResult, np.ndarray, float, list[float]]:
    """:func:`~kpca_dask.solvers.randomized.randomized_eigh` (block Krylov, with its
    certification pass) on ``Kc = H K H`` with the basis on the workers. Returns the
    result, the row means (gathered), the grand mean and the seconds of each product."""
    if method != "block_krylov":  # pragma: no cover - the caller checks
        raise ValueError("the worker basis runs block Krylov only")
    s = _settings(
        K.n,
        n_components,
        n_oversamples=n_oversamples,
        n_power_iter=n_power_iter,
        method=method,
        tol=tol,
        max_passes=max_passes,
        max_basis=max_basis,
        eps=eps,
        centre=True,
        rank_rtol=None,
        cluster_rtol=None,
        tail_tol=None,
    )
    pb = PanelBasis(K)
    try:
        return _solve(pb, s, random_state, v0, warn, tol)
    finally:
        pb.close()


def _first_block(pb: PanelBasis, s: Any, random_state: Any, v0: Any) -> int:
    """The Gaussian first block, drawn a panel at a time (the whole draw's numbers),
    centred and orthonormalised on the panels, as resident ``Q``. Returns the warm
    columns used."""
    gen = _generator(random_state)
    V0 = _start_vectors(v0, s.n, s.l) if v0 is not None else None
    n_warm = 0 if V0 is None else V0.shape[1]
    starts = np.concatenate([[0], np.cumsum(pb.rows)])
    total = np.zeros(s.l)

    def fill(p: int, rows: int) -> np.ndarray:
        nonlocal total
        Om = gen.standard_normal((rows, s.l))
        if n_warm:
            Om[:, :n_warm] = V0[starts[p] : starts[p] + rows] * np.sqrt(s.n)
        total = total + Om.sum(axis=0)
        return Om

    pb.put_rows("Q", fill)
    pb.cols["Q"] = s.l
    pb.run([("sub_mean", "Q", total / s.n)])
    pb.cols["Q"] = pb.orth("Q")
    return n_warm


def _solve(pb: PanelBasis, s: Any, random_state: Any, v0: Any, warn: bool, tol: float):
    # long: solvers/randomized.py's block Krylov loop, step for step, on the panels
    t_start = time.perf_counter()
    n_warm = _first_block(pb, s, random_state, v0)
    pb.run([("reset", "Q")])
    L = pb.cols["Q"]
    (qsum,) = pb.run([("colsum", "Q")])
    M = np.zeros((0, 0))
    drop2, normA = 0.0, 0.0
    history: list[float] = []
    prev = None
    p = 0
    for p in range(1, s.n_passes + 1):
        c = pb.cols["Q"]
        L0 = M.shape[0]
        pb.centred_product("Q", "Y", qsum)
        m = pb._after_product
        S, G = pb.run([("sub_mean", "Y", m), ("tn", "W", "Y"), ("tn", "Y", "Y")])
        top = float(np.sqrt(max(np.linalg.eigvalsh((G + G.T) / 2)[-1], 0.0)))
        normA = max(normA, top)
        tau = s.noise * normA
        # the next block: CGS2 against W, then rank-revealing orthonormalisation
        pb.cols["R"] = c
        if s.n - L <= 0:
            pb.cols["R"] = 0
            dropped = 0.0
        else:
            (S2,) = pb.run([("proj", "R", "Y", S), ("tn", "W", "R")])
            (GR,) = pb.run([("proj", "R", "R", S2), ("tn", "R", "R")])
            r, dropped, well = pb.rank_revealing_orth("R", GR, tau)
            if r > s.n - L:  # pragma: no cover - rounding noise beyond the space
                pb.run([("mul", "R", "R", np.eye(r)[:, : s.n - L])])
                pb.cols["R"] = r = s.n - L
            if r and not well:
                (S3,) = pb.run([("tn", "W", "R")])
                pb.run([("proj", "R", "R", S3)])
                pb.orth("R")
        drop2 += dropped**2
        M = np.block([[M, S[:L0]], [S[:L0].T, (S[L0:] + S[L0:].T) / 2]])
        theta, U = _rayleigh_ritz(M)
        cn = pb.cols["R"]
        if cn:
            H, qsum = pb.run([("tn", "R", "Y"), ("colsum", "R")])
        else:
            H, qsum = np.zeros((0, c)), np.zeros(0)
        B = H @ U[L0 : L0 + c]
        res = np.linalg.norm(B, axis=0) + np.sqrt(drop2)
        drop = float(np.sqrt(drop2))

        def block_res(a, b, B=B, drop=drop):
            return (np.linalg.norm(B[:, a:b], 2) if B.size else 0.0) + drop

        exhausted = cn == 0
        below = tau if exhausted else None
        cert = _certify(theta, res, block_res, theta, tau, below, s)
        est = theta[: s.k]
        if prev is not None and len(prev) == len(est):
            scale = np.maximum(np.abs(est), np.finfo(float).tiny)
            history.append(float(np.max(np.abs(est - prev) / scale)))
        prev = est
        logger.info(
            "randomized solver (worker basis): pass %d, %d basis columns, top eigenvalue %.6g",
            p,
            M.shape[0],
            theta[0],
        )
        if (not s.fixed and cert["ok"]) or p == s.n_passes or exhausted:
            break
        if L + cn > s.max_basis:  # restart from the current best l vectors
            pb.run([("mul", "Q", "W", U[:, : s.l])])
            pb.cols["Q"] = s.l
            (cs,) = pb.run([("colsum", "Q")])
            pb.run([("sub_mean", "Q", cs / s.n)])
            pb.orth("Q")
            pb.run([("reset", "Q")])
            (qsum,) = pb.run([("colsum", "Q")])
            L, M, drop2 = pb.cols["Q"], np.zeros((0, 0)), 0.0
            continue
        pb.run([("append", "R"), ("mul", "Q", "R", np.eye(cn))])
        pb.cols["Q"] = cn
        L += cn
    # the certification pass
    k_ret = _n_existing(theta, s.k, s.rank_rtol, tau)
    Lm = M.shape[0]
    pb.cols["V"] = k_ret
    if k_ret:
        pb.run([("mul", "V", "W", U[:Lm, :k_ret])])
        (vs,) = pb.run([("colsum", "V")])
        pb.run([("sub_mean", "V", vs / s.n)])
        k_ret = pb.orth("V")
        (vs,) = pb.run([("colsum", "V")])
        pb.centred_product("V", "AV", vs)
        (T,) = pb.run([("sub_mean", "AV", pb._after_product), ("tn", "V", "AV")])
    else:
        T = np.zeros((0, 0))
    th2, U2 = _rayleigh_ritz(T)
    if k_ret:
        (GR,) = pb.run(
            [
                ("lincomb", "Rf", [("AV", U2), ("V", -(U2 * th2))]),
                ("tn", "Rf", "Rf"),
                ("mul", "Vr", "V", U2),
            ]
        )
        vectors = pb.gather("Vr")
    else:
        GR = np.zeros((0, 0))
        vectors = np.zeros((s.n, 0))
    mu = pb.gather("mu")
    r2 = np.sqrt(np.maximum(np.diag(GR), 0.0))
    th_all = np.concatenate([th2, theta[k_ret:]])
    res_all = np.concatenate([r2, res[k_ret:]])

    def rf_norm2(a, b):
        if b <= a:
            return 0.0
        return float(np.sqrt(max(np.linalg.eigvalsh(GR[a:b, a:b])[-1], 0.0)))

    def final_block_res(a, b):
        inner = rf_norm2(a, min(b, k_ret)) if a < k_ret else 0.0
        outer = block_res(max(a, k_ret), b) if b > k_ret else 0.0
        return float(np.hypot(inner, outer))

    fcert = _certify(th_all, res_all, final_block_res, theta, tau, below, s)
    with np.errstate(divide="ignore", invalid="ignore"):
        residuals = r2 / np.abs(th2)
    converged = bool(fcert["ok"])
    n_passes = p + 1
    if not converged and warn:
        warnings.warn(
            not_converged_message(fcert, n_passes, tol), ConvergenceWarning, stacklevel=4
        )
    info = {
        "solver": "randomized",
        "method": "block_krylov",
        "block_columns": s.l,
        "finish": "rayleigh_ritz",
        "basis_columns": int(Lm),
        "rank_found": int(k_ret),
        "exhausted": bool(exhausted),
        "relative_changes": history,
        "warm_start": int(n_warm),
        "certificate": dict(fcert),
        "seconds": time.perf_counter() - t_start,
        "basis": "workers",
        "basis_round_trips": pb.round_trips,
    }
    res = EigResult(
        eigenvalues=th2,
        eigenvectors=deterministic_signs(vectors),
        residuals=residuals,
        n_passes=n_passes,
        converged=converged,
        info=info,
    )
    return res, mu, pb.grand_mean, list(pb.pass_seconds)


def _certify(theta, res, block_res, step_theta, tau, below, s):
    return certify(
        theta,
        res,
        _n_existing(step_theta, s.k, s.rank_rtol, tau),
        block_res,
        tol=s.tol,
        floor=tau,
        cluster_rtol=s.cluster_rtol,
        angle_tol=s.angle_tol,
        below=below,
        cluster_tol=s.tol**0.75,
        tail_tol=_tail_level(theta, tau, s),
    )


def uses_worker_basis(K: Any, method: str) -> bool:
    """Whether the randomized solve of ``K`` keeps its basis on the workers: the
    per-worker driver runs ``K``'s products, block Krylov, and :data:`BASIS_CONFIG`
    is not False."""
    import dask

    if method != "block_krylov" or not dask.config.get(BASIS_CONFIG, True):
        return False
    check = getattr(K, "_uses_worker_passes", None)
    return bool(check is not None and (K._worker_passes is not None or check()))
