"""Nightly update vs full refit: n training rows plus a batch of b new rows.

    python benchmarks/bench_update.py --n 1000000 --batch 100000 --m 2048

X (n x 64, float64, clustered) and the batch are zarr stores on disk (chunks of 65 536
rows, never loaded whole). Three fits, each timed in this process on the threaded Dask
scheduler (BLAS threads as the estimator sets them):

1. ``fit``: Nyström on the n rows with ``keep_statistics=True`` (the model a nightly
   run publishes);
2. ``update``: ``partial_fit`` with the batch (one pass over the b new rows and an m x m
   eigendecomposition; the n old rows are not read);
3. ``refit, same landmarks``: a fit on all n + b rows with the model's landmarks (what
   the update must equal; its eigenvalues and embedding are compared);
4. ``refit``: a fresh fit on all n + b rows (new landmarks): the night without updates.

Accuracy: max relative eigenvalue difference and max embedding difference (relative to
the embedding's largest entry, on a 20 000-row sample) between update and (3); between
update and (4) the eigenvalue difference says what refreshing the landmarks changes.
Results are printed as a markdown table (docs/benchmarks.md quotes it).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import dask.array as da
import numpy as np

D = 64
K = 16
CHUNK = 65_536


def clustered(path: Path, n: int, seed: int) -> Path:
    """n x 64 rows around 20 centres (fixed by seed 0), written chunk by chunk."""
    import zarr

    if path.exists():
        return path
    centres = np.random.default_rng(0).normal(scale=2.0, size=(20, D))
    z = zarr.create_array(str(path), shape=(n, D), chunks=(CHUNK, D), dtype="f8")
    rng = np.random.default_rng(seed)
    for a in range(0, n, CHUNK):
        b = min(n, a + CHUNK)
        lab = rng.integers(0, 20, b - a)
        z[a:b] = centres[lab] + rng.normal(size=(b - a, D))
    return path


def cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=100_000)
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--cache", default=os.environ.get("KPCA_BENCH_CACHE", "/tmp/kpca-bench"))
    ap.add_argument("--skip-refit", action="store_true", help="skip the fresh refit (4)")
    args = ap.parse_args()

    import zarr

    from kpca_dask import KernelPCA
    from kpca_dask.solvers.nystroem import nystroem_basis, nystroem_eigh

    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    Xo = da.from_zarr(zarr.open_array(str(clustered(cache / f"upd-{args.n}.zarr", args.n, 1))))
    Xb = da.from_zarr(
        zarr.open_array(str(clustered(cache / f"upd-batch-{args.batch}.zarr", args.batch, 2)))
    )
    params = dict(
        n_components=K,
        kernel="rbf",
        gamma=1.0 / (2 * D),
        eigen_solver="nystroem",
        n_landmarks=args.m,
        dtype=args.dtype,
        random_state=0,
        keep_statistics=True,
    )
    rows = []
    t = time.perf_counter()
    est = KernelPCA(**params).fit(Xo)
    rows.append(("fit on n rows (keep_statistics)", args.n, time.perf_counter() - t))
    t = time.perf_counter()
    est.partial_fit(Xb)
    t_update = time.perf_counter() - t
    rows.append(("update with the batch", args.batch, t_update))

    U = da.concatenate([Xo, Xb]).rechunk({0: CHUNK})
    t = time.perf_counter()
    basis = nystroem_basis(est.landmarks_, est.kernel_, est._dtype, shift=est.statistics_.shift)
    same = nystroem_eigh(U.rechunk({0: 8192}), basis, K, method="covariance")
    rows.append(("refit, same landmarks", args.n + args.batch, time.perf_counter() - t))
    fresh = None
    if not args.skip_refit:
        t = time.perf_counter()
        fresh = KernelPCA(**params).fit(U)
        rows.append(("refit (new landmarks)", args.n + args.batch, time.perf_counter() - t))

    rel = np.max(np.abs(est.eigenvalues_ - same.eigenvalues) / same.eigenvalues)
    idx = np.sort(np.random.default_rng(3).choice(args.n + args.batch, 20_000, replace=False))
    S = np.asarray(U[idx].compute(), dtype=np.float64)
    e_upd = est.transform(S)
    Kz = np.asarray(est.kernel_(S, est.landmarks_, dtype=np.float64))
    e_same = Kz @ same.projection - same.offset
    emb_err = np.abs(e_upd - e_same).max() / np.abs(e_same).max()

    head = f"n = {args.n} + batch {args.batch}, d = {D}, m = {args.m}, {args.dtype}"
    print(f"\n## update: {head}")
    print(f"CPU: {cpu()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}\n")
    print("| step | rows read | seconds |")
    print("|---|---|---|")
    for name, n, s in rows:
        print(f"| {name} | {n} | {s:.1f} |")
    print(
        f"\nupdate vs refit with the same landmarks: eigenvalues {rel:.1e} relative, "
        f"embedding {emb_err:.1e} (of its largest entry)"
    )
    if fresh is not None:
        rel2 = np.max(np.abs(est.eigenvalues_ - fresh.eigenvalues_) / fresh.eigenvalues_)
        print(f"update vs fresh refit (new landmarks): eigenvalues {rel2:.1e} relative")
        print(f"update speed-up over the fresh refit: {rows[3][2] / t_update:.1f}x")


if __name__ == "__main__":
    main()
