"""Passes, columns multiplied and certificate outcome against ``n_oversamples`` (issue 29).

Machine-independent counts for the block-size question (docs/solvers.md, "The block
size"): for each seed and each value of ``n_oversamples`` (alternating), one default
fit ``KernelPCA(16, kernel="rbf", gamma=1/64, random_state=seed, n_oversamples=o)`` on
the headline's data; recorded: ``n_passes_``, the columns multiplied by the centred
operator's passes (``CentredKernel._product``: the iteration, its certification pass
and the first pass's column of ones for the row means; not the float64 pass), the
basis size, the certificate's kinds, whether the fit fell back to float64 blocks (and
why), and the process CPU seconds (rough on a shared machine).

    python benchmarks/bench_block_columns.py --data clustered --n 20000 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_headline import GAMMA, K, make_data  # noqa: E402

import kpca_dask.centering as centering  # noqa: E402
from kpca_dask import KernelPCA  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--data", default="clustered", choices=["clustered", "gaussian"])
    ap.add_argument("--oversamples", type=int, nargs="+", default=[16, 0, 4, 8, 12, 24])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    columns: list[int] = []
    inner = centering.CentredKernel._product

    def counted(self, Z):
        columns.append(int(Z.shape[1]))
        return inner(self, Z)

    centering.CentredKernel._product = counted
    X = make_data(args.data, args.n)
    rows = []
    for seed in args.seeds:
        for o in args.oversamples:
            columns.clear()
            m = KernelPCA(K, kernel="rbf", gamma=GAMMA, random_state=seed, n_oversamples=o)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                cpu = time.process_time()
                m.fit(X)
                cpu = time.process_time() - cpu
            si = m.solver_info_
            cert = si["certificate"]
            mixed = si.get("mixed_precision") or {}
            row = {
                "data": args.data,
                "n": args.n,
                "seed": seed,
                "n_oversamples": o,
                "passes": int(m.n_passes_),
                "columns_multiplied": int(sum(columns)),
                "basis_columns": si.get("basis_columns"),
                "converged": bool(m.converged_),
                "certified": {k: cert["certified"].count(k) for k in set(cert["certified"])},
                "tail_start": cert.get("tail_start"),
                "block_dtype": si.get("block_dtype"),
                "fallback_reason": mixed.get("reason"),
                "cpu_seconds": cpu,
                "eigenvalues": [float(x) for x in m.eigenvalues_],
                "warnings": sorted({w.category.__name__ for w in caught}),
            }
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "eigenvalues"}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
