"""GridSearchCV on digits with a dask Client active: ours against scikit-learn's KernelPCA.

Issue 27 (item 9): with a ``distributed`` Client active, a grid search over the
estimator on sklearn's digits took 11.3-12.7 s against scikit-learn's 5.2-5.6 s; every
small fit paid the cluster's round trips. The estimator now runs a fit on the client's
threads when the cost model says the cluster would not pay
(``kpca_dask.cost.choose_execution``, said in ``solver_info_["executed"]``).

One run, side by side, with a real LocalCluster Client active throughout:

* ``sklearn``: ``sklearn.decomposition.KernelPCA``;
* ``ours``: ``kpca_dask.KernelPCA`` as shipped (the execution rule decides);
* ``ours-cluster``: the same with ``dask.config.set({"kpca.execution": "cluster"})``,
  every fit on the cluster (the behaviour the issue measured).

Each is a ``Pipeline(KernelPCA(kernel="rbf"), LogisticRegression)`` searched over gamma
x n_components with 5-fold CV; ``--repeat`` rounds in rotating order. The load average
is recorded before and after every measurement (the machine is shared).

    python benchmarks/bench_gridsearch.py --repeat 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._results import fresh  # noqa: E402

GAMMAS = [1e-4, 5e-4, 1e-3, 5e-3]
COMPONENTS = [8, 16, 32]


def search(kpca, X, y, cv: int = 5, n_jobs: int = 1) -> tuple[float, float, dict]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline

    pipe = Pipeline([("kpca", kpca), ("clf", LogisticRegression(max_iter=300))])
    grid = {"kpca__gamma": GAMMAS, "kpca__n_components": COMPONENTS}
    gs = GridSearchCV(pipe, grid, cv=cv, n_jobs=n_jobs)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gs.fit(X, y)
    return time.perf_counter() - t0, float(gs.best_score_), gs.best_params_


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cv", type=int, default=5)
    ap.add_argument(
        "--small",
        action="store_true",
        help=f"2 gammas x 2 n_components (a loaded machine): {GAMMAS[1:3]} x [16, 32]",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.small:
        GAMMAS[:] = GAMMAS[1:3]
        COMPONENTS[:] = [16, 32]

    import dask
    import sklearn
    from distributed import Client, LocalCluster
    from sklearn.datasets import load_digits
    from sklearn.decomposition import KernelPCA as SkKernelPCA

    from kpca_dask import KernelPCA
    from kpca_dask.cost import EXECUTION_CONFIG

    X, y = load_digits(return_X_y=True)
    cases = {
        "sklearn": lambda: SkKernelPCA(kernel="rbf"),
        "ours": lambda: KernelPCA(kernel="rbf"),
        "ours-cluster": lambda: KernelPCA(kernel="rbf"),
    }
    rows = []
    with (
        LocalCluster(
            n_workers=args.workers,
            threads_per_worker=args.threads,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
        ) as cluster,
        Client(cluster) as client,
    ):
        # what the rule decided for one fold-sized fit, and the same fit on the cluster
        probe = KernelPCA(16, kernel="rbf", gamma=1e-3).fit(X[:1437])
        executed = probe.solver_info_["executed"]
        with dask.config.set({EXECUTION_CONFIG: "cluster"}):
            forced = KernelPCA(16, kernel="rbf", gamma=1e-3).fit(X[:1437])
        import numpy as np

        agree = float(
            np.max(np.abs(np.abs(probe.eigenvectors_) - np.abs(forced.eigenvectors_)))
        )
        print(
            f"fold-sized fit: {executed}; |vectors| differ from the cluster's by {agree:.1e}",
            flush=True,
        )
        names = list(cases)
        for rep in range(args.repeat):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                load0 = os.getloadavg()
                cfg = {EXECUTION_CONFIG: "cluster" if name == "ours-cluster" else "auto"}
                with dask.config.set(cfg):
                    sec, score, best = search(cases[name](), X, y, cv=args.cv)
                load1 = os.getloadavg()
                rows.append(
                    {
                        "case": name,
                        "round": rep,
                        "seconds": sec,
                        "best_score": score,
                        "best_params": best,
                        "load_before": load0,
                        "load_after": load1,
                    }
                )
                print(
                    f"round {rep} {name:<13} {sec:7.2f} s  best {score:.4f} {best}  "
                    f"load {load0[0]:.2f} -> {load1[0]:.2f}",
                    flush=True,
                )
        workers = len(client.scheduler_info()["workers"])
    summary = {}
    for name in cases:
        secs = sorted(r["seconds"] for r in rows if r["case"] == name)
        summary[name] = {"best": secs[0], "median": secs[len(secs) // 2], "all": secs}
    ratio = summary["ours"]["median"] / summary["sklearn"]["median"]
    print(
        "median: "
        + ", ".join(f"{k} {v['median']:.2f} s" for k, v in summary.items())
        + f"; ours / sklearn = {ratio:.2f}"
    )
    out = args.out or fresh(
        Path(__file__).parent / "results" / f"gridsearch-digits-{datetime.date.today()}.json"
    )
    out.write_text(
        json.dumps(
            {
                "command": " ".join(["python", *sys.argv]),
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "machine": {
                    "node": platform.node(),
                    "cpu": platform.processor(),
                    "cpus": os.cpu_count(),
                },
                "cluster": {"workers": workers, "threads": args.threads},
                "grid": {"gamma": GAMMAS, "n_components": COMPONENTS, "cv": args.cv},
                "sklearn": sklearn.__version__,
                "fold_fit_executed": executed,
                "fold_fit_max_abs_vector_difference_vs_cluster": agree,
                "rows": rows,
                "summary": summary,
                "ours_over_sklearn_median": ratio,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
