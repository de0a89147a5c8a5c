"""The denoise stage on real run folders: denoised rows next to the embedding."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from sklearn.decomposition import PCA

import kpca_dask
from kpca_dask import KernelPCA
from pipeline.config import load_config
from pipeline.embed.denoise import (
    DenoiseConfig,
    DenoiseError,
    denoise_to_store,
    estimator_params,
    stage_denoise,
)
from pipeline.runner.run import stage_begin
from pipeline.stages import stage_ingest, stage_kernel, stage_project, stage_solve, stage_split

RNG = np.random.default_rng(0)
N, D = 600, 4
CENTRES = RNG.standard_normal((3, D)) * 3
X = RNG.standard_normal((N, D)) + np.repeat(CENTRES, N // 3, axis=0)
LABELS = np.repeat([0, 1, 2], N // 3)


def _config(tmp_path, npy, **over):
    cfg = {
        "input": {"path": str(npy)},
        "preprocess": {"scale": "none"},  # compared with the estimator on the raw rows
        "kernel": {"name": "rbf", "gamma": 0.1},
        "solver": {
            "n_components": 3,
            "eigen_solver": "dense",
            "dtype": "float64",
            "random_state": 0,
        },
        "chunks": {"target_chunk_mb": 0.005, "block_rows": 128},  # several row chunks
        "output": {"path": str(tmp_path / "out"), "parquet": False},
        "evaluate": {"enabled": False},
    }
    for k, v in over.items():
        cfg.setdefault(k, {}).update(v)
    return load_config(cfg)


def _run(cfg):
    """The stages up to project; the solve stage fits the pre-image when cfg.denoise.enabled."""
    stage_begin(cfg)
    ing = stage_ingest(cfg)
    split = stage_split(cfg, ing)
    kernel = stage_kernel(cfg, ing, split)
    solved = stage_solve(cfg, ing, split, kernel)
    stage_project(cfg, ing, split, solved)
    return ing, split, solved


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    p = tmp_path_factory.mktemp("in") / "x.npy"
    np.save(p, X)
    return p


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    import pandas as pd

    p = tmp_path_factory.mktemp("in") / "x.parquet"
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(D)])
    df["y"] = LABELS
    df.to_parquet(p, index=False)
    return p


def test_exact_run_denoises_every_row_like_the_estimator(tmp_path, npy):
    """All rows, exact model: the estimator's pre-images of V sqrt(lambda), row-chunked."""
    cfg = _config(tmp_path, npy, denoise={"enabled": True, "alpha": 0.01})
    ing, split, solved = _run(cfg)
    info = stage_denoise(cfg, ing, split, solved)
    json.dumps(info)
    assert info["rows"] == N and info["method"] == "learned" and info["index_array"] is None
    ref = KernelPCA(
        3, kernel="rbf", gamma=0.1, eigen_solver="dense", fit_inverse_transform=True, alpha=0.01
    ).fit(X)
    want = ref.inverse_transform(ref.eigenvectors_ * np.sqrt(ref.eigenvalues_))
    g = zarr.open_group(str(tmp_path / "out"), mode="r")
    z = g["denoised"]
    assert z.shape == (N, D) and z.chunks[0] == g["embedding"].chunks[0]
    assert z.attrs["columns"] == ing.columns
    np.testing.assert_allclose(z[...], want, rtol=1e-8, atol=1e-8)
    assert info["mean_squared_change"] == pytest.approx(np.mean((want - X) ** 2), rel=1e-8)
    # idempotent, and a disabled re-run removes the stale array
    again = stage_denoise(cfg, ing, split, solved)
    assert again["rows"] == N
    np.testing.assert_array_equal(
        zarr.open_group(str(tmp_path / "out"))["denoised"][...], z[...]
    )
    off = _config(tmp_path, npy, denoise={"enabled": False, "alpha": 0.01})
    assert stage_denoise(off, ing, split, solved) == {"enabled": False}
    assert "denoised" not in zarr.open_group(str(tmp_path / "out"), mode="r")


def test_nystroem_fixed_point_on_held_out_rows(tmp_path, labelled):
    """Held-out rows (capped), Nyström + fixed point: the in-memory model's pre-images."""
    cfg = _config(
        tmp_path,
        labelled,
        input={"label_column": "y"},
        solver={"eigen_solver": "nystroem", "n_landmarks": 60, "landmark_method": "uniform"},
        evaluate={"enabled": True, "test_fraction": 0.25},
        denoise={
            "enabled": True,
            "preimage": "fixed_point",
            "alpha": 1e-3,
            "rows": "held_out",
            "max_rows": 70,
            "output_name": "clean",
        },
    )
    ing, split, solved = _run(cfg)
    info = stage_denoise(cfg, ing, split, solved)
    g = zarr.open_group(str(tmp_path / "out"), mode="r")
    mask = g["split"][...].astype(bool)
    held = np.flatnonzero(~mask)[:70]
    np.testing.assert_array_equal(g["clean_rows"][...], held)
    assert info["rows"] == 70 and info["method"] == "fixed_point"
    assert info["fixed_point_not_converged"] == {"max_iter": 0, "diverged": 0}
    ref = KernelPCA(
        3,
        kernel="rbf",
        gamma=0.1,
        eigen_solver="nystroem",
        n_landmarks=60,
        landmark_method="uniform",
        random_state=0,
        fit_inverse_transform=True,
        alpha=1e-3,
        preimage="fixed_point",
    ).fit(X[mask])
    want = ref.inverse_transform(ref.transform(X[held]))
    np.testing.assert_allclose(g["clean"][...], want, rtol=1e-6, atol=1e-6)
    # the fixed point moved the rows off the learned pre-image
    learned = ref.inverse_transform(ref.transform(X[held]), method="learned")
    assert np.abs(g["clean"][...] - learned).max() > 1e-3


def test_linear_kernel_denoising_is_linear_pca(tmp_path, npy):
    cfg = _config(
        tmp_path,
        npy,
        kernel={"name": "linear"},
        solver={"n_components": 2},
        denoise={"enabled": True},
    )
    ing, split, solved = _run(cfg)
    info = stage_denoise(cfg, ing, split, solved)
    assert info["method"] == "exact"
    pca = PCA(2).fit(X)
    np.testing.assert_allclose(
        zarr.open_group(str(tmp_path / "out"))["denoised"][...],
        pca.inverse_transform(pca.transform(X)),
        rtol=1e-9,
        atol=1e-9,
    )


def test_a_model_without_preimage_is_refused(tmp_path, npy):
    ing, split, solved = _run(_config(tmp_path, npy))  # solve without the pre-image
    with pytest.raises(DenoiseError, match="has no pre-image.*re-run the solve stage"):
        stage_denoise(_config(tmp_path, npy, denoise={"enabled": True}), ing, split, solved)
    with pytest.raises(DenoiseError, match="needs held-out rows"):
        stage_denoise(
            _config(tmp_path, npy, denoise={"enabled": True, "rows": "held_out"}),
            ing,
            split,
            solved,
        )


def test_a_model_fitted_for_another_alpha_is_refused(tmp_path, npy):
    ing, split, solved = _run(_config(tmp_path, npy, denoise={"enabled": True, "alpha": 0.5}))
    with pytest.raises(DenoiseError, match="alpha=0.5 but denoise.alpha=1.0"):
        stage_denoise(_config(tmp_path, npy, denoise={"enabled": True}), ing, split, solved)


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"enabled": True, "colour": 1}, "Extra inputs"),
        ({"output_name": "embedding"}, "plain array name"),
        ({"output_name": "../x"}, "plain array name"),
        ({"sample_size": 0}, r"must be an int in the range \[1, inf\) or 'auto'"),
        ({"preimage": "newton"}, "Input should be"),
        ({"alpha": -1}, r"must be a float in the range \[0, inf\)"),
    ],
)
def test_config_is_validated(bad, match):
    with pytest.raises(ValueError, match=match):
        DenoiseConfig(**bad)


def test_estimator_params_only_when_enabled():
    assert estimator_params(DenoiseConfig()) == {}
    p = estimator_params(
        DenoiseConfig(enabled=True, preimage="fixed_point", alpha=0.1, sample_size=500)
    )
    m = KernelPCA(kernel="rbf").set_params(**p)  # every key is a KernelPCA parameter
    assert m.fit_inverse_transform and m.preimage == "fixed_point" and m.alpha == 0.1


def test_denoise_to_store_with_a_model_folder(tmp_path):
    """`kpca transform --inverse`: new data in, denoised zarr out."""
    from pipeline.config import InputConfig

    m = KernelPCA(3, kernel="rbf", gamma=0.1, fit_inverse_transform=True, alpha=0.01).fit(X)
    m.save(tmp_path / "model")
    new = X[:50] + 0.5
    np.save(tmp_path / "new.npy", new)
    info = denoise_to_store(
        str(tmp_path / "model"),
        InputConfig(path=str(tmp_path / "new.npy")),
        str(tmp_path / "den.zarr"),
    )
    assert info["rows"] == 50
    from pipeline.output.versions import open_output

    g = open_output(tmp_path / "den.zarr").data.open_group("r")  # the published version
    assert g.attrs["status"] == "complete" and g.attrs["method"] == "learned"
    loaded = kpca_dask.load(tmp_path / "model")
    np.testing.assert_allclose(
        g["denoised"][...],
        loaded.inverse_transform(loaded.transform(new)),
        rtol=1e-12,
        atol=1e-12,
    )
    with pytest.raises(FileExistsError, match="overwrite"):
        denoise_to_store(
            str(tmp_path / "model"),
            InputConfig(path=str(tmp_path / "new.npy")),
            str(tmp_path / "den.zarr"),
        )
