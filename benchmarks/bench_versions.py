"""Two checkouts side by side: the same exact and Nyström fits, interleaved.

A refactor that preserves behaviour should leave these figures within noise.
Each fit runs in a fresh process with the checkout first on ``PYTHONPATH``;
the checkouts alternate within every repeat, so load on a shared machine
falls on both alike, and the ratios are what to read.

    git worktree add /tmp/old <commit>
    python benchmarks/bench_versions.py /tmp/old . --repeat 3

Cases (defaults as users run them, d = 64, rbf, gamma = 1/64, 16 components):

* ``exact``: ``KernelPCA(eigen_solver="randomized")`` on standard normal
  rows (n = 10 000 by default; ``--exact-n``);
* ``nystroem``: ``KernelPCA(eigen_solver="nystroem", n_landmarks=1024)`` on
  standard normal rows (n = 200 000; ``--nystroem-n``).

``--data clustered``: the headline's rows instead (10 blobs, make_blobs, d = 64).
``--new-params '{"block_dtype": "float64"}'``: extra parameters for the new checkout's
exact fit (the same computation when the new checkout changed a default);
``--cases exact``: only one case.

Prints wall time, passes and the largest eigenvalue per checkout, the median
ratio new/old, and writes ``results/versions-<old>-<new>-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _results import fresh  # benchmarks/ is on sys.path: the script's folder

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time, warnings
import numpy as np
import dask
from kpca_dask import KernelPCA
case, n, data = sys.argv[1], int(sys.argv[2]), sys.argv[3]
extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
if data == "clustered":  # the headline's data (bench_headline.py): 10 blobs, d = 64
    from sklearn.datasets import make_blobs
    X = make_blobs(n, n_features=64, centers=10, random_state=0)[0]
else:
    X = np.random.default_rng(0).standard_normal((n, 64))
if case == "exact":
    est = KernelPCA(16, kernel="rbf", gamma=1 / 64, eigen_solver="randomized", random_state=0,
                    **extra)
else:
    est = KernelPCA(16, kernel="rbf", gamma=1 / 64, eigen_solver="nystroem",
                    n_landmarks=1024, random_state=0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    est.fit(X)
    dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "passes": int(getattr(est, "n_passes_", 0) or 0),
                  "lambda1": float(est.eigenvalues_[0]),
                  "converged": bool(getattr(est, "converged_", True))}))
"""


def run(tree: Path, case: str, n: int, data: str, extra: str = "{}") -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(n), data, extra],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--exact-n", type=int, default=10000)
    ap.add_argument("--nystroem-n", type=int, default=200000)
    ap.add_argument(
        "--data",
        choices=["gaussian", "clustered"],
        default="gaussian",
        help="standard normal rows, or the headline's 10 blobs (make_blobs, d = 64)",
    )
    ap.add_argument(
        "--new-params",
        default="{}",
        help="JSON of extra KernelPCA parameters for the new checkout's exact fit (e.g. "
        '\'{"block_dtype": "float64"}\' to compare the same computation across a new default)',
    )
    ap.add_argument("--cases", nargs="+", default=["exact", "nystroem"])
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from bench_passes import cpu_model  # noqa: E402  (benchmarks/ is not a package)

    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    commits = {
        k: subprocess.run(
            ["git", "-C", str(t), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        for k, t in trees.items()
    }
    rows: dict[str, dict[str, list[dict]]] = {}
    sizes = {"exact": args.exact_n, "nystroem": args.nystroem_n}
    for case, n in ((c, sizes[c]) for c in args.cases):
        rows[case] = {"old": [], "new": []}
        for r in range(args.repeat):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for which in order:
                extra = args.new_params if which == "new" else "{}"
                res = run(trees[which], case, n, args.data, extra)
                rows[case][which].append(res)
                print(
                    f"{case:9s} n={n:<7d} {which} ({commits[which]}): "
                    f"{res['seconds']:7.2f} s, {res['passes']} passes, "
                    f"lambda1 {res['lambda1']:.6g}",
                    flush=True,
                )
    summary = {}
    for case, by in rows.items():
        med = {w: statistics.median(x["seconds"] for x in by[w]) for w in by}
        summary[case] = {"median_seconds": med, "ratio_new_over_old": med["new"] / med["old"]}
        print(
            f"{case}: median old {med['old']:.2f} s, new {med['new']:.2f} s, "
            f"new/old {med['new'] / med['old']:.2f}"
        )
    record = {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "load_before": os.getloadavg()[0],
        "commits": commits,
        "repeat": args.repeat,
        "data": args.data,
        "new_params": json.loads(args.new_params),
        "runs": rows,
        "summary": summary,
    }
    out = fresh(
        HERE / "results" / f"versions-{commits['old']}-{commits['new']}-{record['date']}.json"
    )
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
