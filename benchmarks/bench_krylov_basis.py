"""The randomized solver's driver algebra, now and with the numpy formulas it replaced
(issue 29).

One default fit (``KernelPCA(16, kernel="rbf", gamma=1/64)``, the headline's data) is
run once to record the products ``A Q`` it computed; then ``randomized_eigh`` is
replayed on those recorded products (the operator returns them in turn, so a pass
costs nothing and only the driver's work is left), with the code as it is and with
the basis functions replaced by the plain numpy expressions of before (``W.T @ Y``,
``Y - W @ S``, ``Q @ Cinv.T`` ...), alternating, on one BLAS thread (the driver's
budget). Times are the replaying thread's CPU time (``time.thread_time``), which a
busy machine disturbs less than wall time; medians over ``--repeats``.

    python benchmarks/bench_krylov_basis.py --n 20000 --data clustered
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_headline import GAMMA, K, make_data  # noqa: E402
from bench_passes import cpu_model  # noqa: E402

from kpca_dask import KernelPCA  # noqa: E402
from kpca_dask.solvers import randomized, randomized_setup  # noqa: E402
from tests.kpca_dask import krylov_reference as ref  # noqa: E402  (numpy, before issue 29)

NUMPY = {
    (randomized, "_next_block"): ref.next_block_ref,
    (randomized, "_orth"): ref.orth_ref,
    (randomized, "_rank_revealing_orth"): ref.rank_revealing_ref,
    (randomized_setup, "_orth"): ref.orth_ref,
    (randomized, "_matmul"): lambda W, U: W @ U,
}


class Recorded:
    """The operator of a recorded fit: returns its products in turn."""

    def __init__(self, products):
        self.products, self.i = products, 0

    @property
    def n(self):
        return self.products[0].shape[0]

    def matmul(self, Z):
        Y = self.products[min(self.i, len(self.products) - 1)]
        self.i += 1
        return Y if Y.shape[1] == Z.shape[1] else Y[:, : Z.shape[1]].copy()


def record(X) -> tuple[list[np.ndarray], dict]:
    """The products ``A Q`` of one default fit's randomized solve, and its keywords."""
    from kpca_dask import _solve

    products, kw = [], {}
    inner = _solve.randomized_eigh

    def spy(op, k, **kwargs):
        class Spy:
            n = op.n

            def matmul(self, Z):
                Y = op.matmul(Z)
                products.append(np.array(Y))
                return Y

        kw.clear()
        products.clear()
        kw.update(kwargs, k=k)
        return inner(Spy(), k, **kwargs)

    _solve.randomized_eigh = spy
    try:
        KernelPCA(K, kernel="rbf", gamma=GAMMA, random_state=0).fit(X)
    finally:
        _solve.randomized_eigh = inner
    return products, kw


TIMED = ("_next_block", "_rayleigh_ritz", "_certification_pass")


def replay(products, kw, numpy_formulas: bool, parts: dict) -> float:
    """Driver seconds (thread CPU time) of the solve replayed on ``products``."""
    keys = list(NUMPY) + [(randomized, name) for name in TIMED]
    saved = {key: getattr(*key) for key in keys}
    timers: dict[str, float] = {}
    try:
        if numpy_formulas:
            for (mod, name), fn in NUMPY.items():
                setattr(mod, name, fn)
        for name in TIMED:
            fn = getattr(randomized, name)

            def timed(*a, _fn=fn, _name=name, **k):
                t = time.thread_time()
                try:
                    return _fn(*a, **k)
                finally:
                    timers[_name] = timers.get(_name, 0.0) + time.thread_time() - t

            setattr(randomized, name, timed)
        args = {
            key: kw[key] for key in ("n_oversamples", "tol", "eps", "random_state") if key in kw
        }
        t = time.thread_time()
        res = randomized.randomized_eigh(
            Recorded(products), kw["k"], n_power_iter=len(products) - 2, warn=False, **args
        )
        total = time.thread_time() - t
    finally:
        for (mod, name), fn in saved.items():
            setattr(mod, name, fn)
    for name, v in timers.items():
        parts.setdefault(name, []).append(v)
    parts.setdefault("eigenvalues", []).append(res.eigenvalues.tolist())
    return total


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--data", default="clustered", choices=["clustered", "gaussian"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    X = make_data(args.data, args.n)
    products, kw = record(X)
    runs = {"now": [], "numpy": []}
    parts = {"now": {}, "numpy": {}}
    for _ in range(args.repeats):
        for name in ("numpy", "now"):
            runs[name].append(replay(products, kw, name == "numpy", parts[name]))
    now = np.asarray(parts["now"]["eigenvalues"][0])
    before = np.asarray(parts["numpy"]["eigenvalues"][0])
    result = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "n": args.n,
        "data": args.data,
        "passes_replayed": len(products) - 1,
        "block_columns": int(products[0].shape[1]),
        "seconds_median": {k: float(np.median(v)) for k, v in runs.items()},
        "seconds": runs,
        "parts_median": {
            k: {p: float(np.median(v)) for p, v in d.items() if p != "eigenvalues"}
            for k, d in parts.items()
        },
        "max_relative_eigenvalue_difference": float(
            np.max(np.abs(now - before) / np.abs(before))
        ),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
