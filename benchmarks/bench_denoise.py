"""Denoising scikit-learn's digits: linear PCA against kernel PCA pre-images.

The experiment of Mika, Schölkopf, Smola et al. (1999) on the 8 x 8 digits
(pixels scaled to [0, 1]): add Gaussian noise, fit on the noisy training
digits, then map each noisy test digit to its projection on the leading
``k`` components and back to input space. Reported: mean squared error per
pixel to the *clean* test digits, for

* linear PCA (scikit-learn ``PCA.inverse_transform``),
* kernel PCA, rbf kernel, learned pre-image (kernel ridge regression,
  ``preimage="learned"``),
* kernel PCA, rbf kernel, fixed-point pre-image (``preimage="fixed_point"``,
  started from the learned one),

at the same ``k``. ``gamma`` and ``alpha`` are picked on a validation split
of the training digits (never on the test digits); PCA has no parameter
besides ``k``. The picture (rows: clean, noisy, PCA, kPCA learned, kPCA fixed
point) goes to ``docs/denoise-digits.png``, the numbers to
``benchmarks/results/denoise-<date>.json``.

    python benchmarks/bench_denoise.py                 # sigma 0.25, k = 4..64
    python benchmarks/bench_denoise.py --sigma 0.5 --picture-k 16
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
import warnings
from pathlib import Path

import numpy as np
from _results import fresh  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def mse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a - b) ** 2))


def kpca_denoise(
    train: np.ndarray, noisy: np.ndarray, k: int, gamma: float, alpha: float, seed: int
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Learned and fixed-point pre-images of ``noisy`` with a model fitted on ``train``."""
    from kpca_dask import KernelPCA
    from kpca_dask.exceptions import PreimageConvergenceWarning

    t0 = time.perf_counter()
    m = KernelPCA(
        k,
        kernel="rbf",
        gamma=gamma,
        eigen_solver="dense",
        dtype="float64",
        fit_inverse_transform=True,
        alpha=alpha,
        preimage_sample_size=len(train),
        random_state=seed,
    ).fit(train)
    Z = m.transform(noisy)
    learned = m.inverse_transform(Z, method="learned")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PreimageConvergenceWarning)
        fixed, status = m.inverse_transform(Z, method="fixed_point", return_status=True)
    info = {
        "seconds": time.perf_counter() - t0,
        "fixed_point_fallbacks": int(np.count_nonzero(status)),
    }
    return learned, fixed, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sigma", type=float, default=0.25, help="noise std (pixels in [0, 1])")
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    ap.add_argument("--gammas", type=float, nargs="+", default=[0.01, 0.02, 0.04, 0.08, 0.16])
    ap.add_argument("--alphas", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1, 1.0])
    ap.add_argument("--test", type=int, default=500, help="test digits")
    ap.add_argument("--picture-k", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--picture", default=str(ROOT / "docs" / "denoise-digits.png"))
    args = ap.parse_args()

    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(args.seed)
    X = load_digits().data / 16.0
    X = X[rng.permutation(len(X))]
    X_train, X_test = X[: -args.test], X[-args.test :]
    N_train = X_train + args.sigma * rng.standard_normal(X_train.shape)
    N_test = X_test + args.sigma * rng.standard_normal(X_test.shape)
    n_val = len(X_train) // 4
    fit_part, val_noisy, val_clean = N_train[:-n_val], N_train[-n_val:], X_train[-n_val:]

    results = {
        "date": datetime.date.today().isoformat(),
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
        },
        "data": {
            "name": "sklearn digits / 16",
            "train": len(X_train),
            "test": len(X_test),
            "validation": n_val,
            "sigma": args.sigma,
        },
        "noisy_mse": mse(N_test, X_test),
        "by_k": {},
    }
    print(
        f"digits: {len(X_train)} train ({n_val} of them for validation), {len(X_test)} test, "
        f"noise sigma {args.sigma}; noisy MSE {results['noisy_mse']:.4f}"
    )
    images = {}
    for k in args.ks:
        # model selection on the validation split of the training digits
        best = {"learned": (np.inf, None), "fixed_point": (np.inf, None)}
        for gamma in args.gammas:
            for alpha in args.alphas:
                learned, fixed, _ = kpca_denoise(
                    fit_part, val_noisy, k, gamma, alpha, args.seed
                )
                for name, rec in (("learned", learned), ("fixed_point", fixed)):
                    err = mse(rec, val_clean)
                    if err < best[name][0]:
                        best[name] = (err, (gamma, alpha))
        pca = PCA(k, random_state=args.seed).fit(N_train)
        rec_pca = pca.inverse_transform(pca.transform(N_test))
        row = {"pca": mse(rec_pca, X_test)}
        recs = {"pca": rec_pca}
        for name in ("learned", "fixed_point"):
            gamma, alpha = best[name][1]
            learned, fixed, info = kpca_denoise(N_train, N_test, k, gamma, alpha, args.seed)
            rec = learned if name == "learned" else fixed
            recs[name] = rec
            row[f"kpca_{name}"] = mse(rec, X_test)
            row[f"kpca_{name}_params"] = {"gamma": gamma, "alpha": alpha, **info}
        results["by_k"][k] = row
        images[k] = recs
        print(
            f"k = {k:3d}: PCA {row['pca']:.4f}  kPCA learned {row['kpca_learned']:.4f} "
            f"(gamma {row['kpca_learned_params']['gamma']}, alpha "
            f"{row['kpca_learned_params']['alpha']})  kPCA fixed point "
            f"{row['kpca_fixed_point']:.4f} (gamma {row['kpca_fixed_point_params']['gamma']}, "
            f"{row['kpca_fixed_point_params']['fixed_point_fallbacks']} fallbacks)",
            flush=True,
        )

    best_of = {
        name: min(results["by_k"].items(), key=lambda kv: kv[1][name])
        for name in ("pca", "kpca_learned", "kpca_fixed_point")
    }
    results["best"] = {
        name: {"k": int(k), "mse": row[name]} for name, (k, row) in best_of.items()
    }
    print(
        "best over k: "
        + ", ".join(
            f"{name} {v['mse']:.4f} (k = {v['k']})" for name, v in results["best"].items()
        )
    )

    out = fresh(HERE / "results" / f"denoise-{results['date']}.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=float))
    print(f"wrote {out}")

    if args.picture_k in images:
        picture(X_test, N_test, images[args.picture_k], args.picture_k, results, args.picture)


def picture(clean, noisy, recs, k, results, path, n_show: int = 12) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    row = results["by_k"][k]
    rows = [
        ("clean", clean, None),
        ("noisy", noisy, results["noisy_mse"]),
        (f"PCA, k={k}", recs["pca"], row["pca"]),
        (f"kPCA learned, k={k}", recs["learned"], row["kpca_learned"]),
        (f"kPCA fixed point, k={k}", recs["fixed_point"], row["kpca_fixed_point"]),
    ]
    fig, axes = plt.subplots(len(rows), n_show, figsize=(n_show * 0.75, len(rows) * 0.95))
    for r, (title, imgs, err) in enumerate(rows):
        for c in range(n_show):
            ax = axes[r, c]
            ax.imshow(np.clip(imgs[c], 0, 1).reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
        label = title if err is None else f"{title}\nMSE {err:.4f}"
        axes[r, 0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
    fig.suptitle(
        f"digits test set, Gaussian noise sigma={results['data']['sigma']}: "
        "MSE to the clean digits (all test digits)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.95))
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
