"""Which eigenvalue bound could certify a flat tail sooner (issue 29, decision 4)?

A replica of the block Krylov iteration (l = 32, seed 0, no deflation) on the dense
centred rbf kernel of the headline's clustered data (k = 16, gamma = 1/64). Per
pass, over the flat tail (10th-16th eigenvalues), the largest relative value of:

* the true error against ``scipy.linalg.eigh``;
* Weyl's bound ``r_i`` (what the certificate uses);
* ``min_{j <= i} (theta_j + r_j) - theta_i`` (monotonicity of the eigenvalues);
* the best group Kato-Temple / Knyazev-Argentati bound ``||R_m||^2 / (theta_m -
  theta_{m+1} - r_{m+1})`` over every m with a positive gap;
* the Haynsworth inertia bound with the exact top ``gamma`` of the operator on
  the unexplored complement of the basis (``eigsh``; an oracle: not computable in
  a fit): the smallest ``t`` with ``lambda_i(Theta + B^T B / (t - gamma)) <= t``.

Slow (one ``eigsh`` on the complement and 16 bisections of L x L ``eigvalsh``
per pass): ~10 min at n = 5 000 on a quiet 2-core machine.

    python benchmarks/bench_tail_bounds.py --n 5000 --passes 11
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import scipy.linalg
import scipy.sparse.linalg as sla

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_headline import K  # noqa: E402  (benchmarks/ is on sys.path)
from bench_solver_passes import centred_kernel  # noqa: E402

N_GAPPED = 9


def inertia_bound(th, r, BtB, gamma, i):
    """Smallest t (bisection) with the i-th eigenvalue of Theta + B^T B / (t - gamma)
    at most t: then lambda_i(A) <= t (Haynsworth inertia, C <= gamma)."""
    lo = max(th[i], gamma) + 1e-9 * th[0]
    hi = lo + 10 * (r[i] + abs(th[0]))
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.linalg.eigvalsh(np.diag(th) + BtB / (mid - gamma))[::-1][i] <= mid:
            hi = mid
        else:
            lo = mid
    return hi


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--passes", type=int, default=11)
    args = ap.parse_args(argv)
    n, k, l = args.n, K, 32
    A = centred_kernel(n)
    w = scipy.linalg.eigh(A, eigvals_only=True, subset_by_index=[n - k, n - 1])[::-1]
    Om = np.random.default_rng(0).standard_normal((n, l))
    Q = np.linalg.qr(Om - Om.mean(0))[0]
    W, M = Q.copy(), np.zeros((0, 0))
    for p in range(1, args.passes + 1):
        Y = A @ Q
        L0 = M.shape[0]
        S = W.T @ Y
        R = Y - W @ S
        R -= W @ (W.T @ R)
        Qn = np.linalg.qr(R)[0]
        M = np.block([[M, S[:L0]], [S[:L0].T, (S[L0:] + S[L0:].T) / 2]])
        th, U = np.linalg.eigh(M)
        o = np.argsort(th)[::-1]
        th, U = th[o], U[:, o]
        B = (Qn.T @ Y) @ U[L0:]
        r = np.linalg.norm(B, axis=0)
        L = M.shape[0]
        err = (w - th[:k]) / w
        weyl = r[:k] / th[:k]
        mono = np.array([np.min(th[: i + 1] + r[: i + 1]) - th[i] for i in range(k)]) / th[:k]
        group = np.full(k, np.inf)
        for m in range(k, L - 1):
            g = th[m - 1] - (th[m] + r[m])
            if g > 0:
                group = np.minimum(group, np.linalg.norm(B[:, :m], 2) ** 2 / g / th[:k])

        def proj(x, W=W):
            return x - W @ (W.T @ x)

        op = sla.LinearOperator((n, n), matvec=lambda x, P=proj: P(A @ P(x)), dtype=float)
        gamma = sla.eigsh(op, k=1, which="LA", tol=1e-6)[0][0]
        BtB = B.T @ B
        inert = np.array(
            [(inertia_bound(th, r, BtB, gamma, i) - th[i]) / th[i] for i in range(k)]
        )
        t = slice(N_GAPPED, k)
        print(
            f"pass {p} L={L} gamma/theta_16={gamma / th[k - 1]:.3f} tail: "
            f"error {err[t].max():.1e} weyl {weyl[t].max():.1e} "
            f"monotone {mono[t].max():.1e} group {group[t].max():.1e} "
            f"inertia(oracle gamma) {inert[t].max():.1e}",
            flush=True,
        )
        W, Q = np.hstack([W, Qn]), Qn


if __name__ == "__main__":
    main()
