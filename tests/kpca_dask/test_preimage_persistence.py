"""Saved models carry the pre-image (arrays + JSON, no pickle); older stores still load."""

import json

import numpy as np
import pytest
import zarr
from sklearn.datasets import make_moons

import kpca_dask
from kpca_dask import KernelPCA, ModelFormatError, NotFittedError
from kpca_dask.exceptions import UnverifiedAttributesWarning
from kpca_dask.persistence import SCHEMA_VERSION

X = make_moons(150, noise=0.05, random_state=0)[0]
NEW = X[:20] + 0.1


@pytest.mark.parametrize(
    "params",
    [
        dict(kernel="rbf", gamma=2.0, preimage="fixed_point", eigen_solver="dense"),
        dict(
            kernel="rbf", gamma=2.0, preimage="learned", eigen_solver="nystroem", n_landmarks=40
        ),
        dict(kernel="linear", eigen_solver="randomized", n_oversamples=0),
        dict(kernel="poly", gamma=0.5, degree=2, preimage_sample_size=60, eigen_solver="dense"),
    ],
    ids=["rbf-fixed-point", "nystroem-learned", "linear-exact", "poly-subsample"],
)
def test_round_trip_inverse_transforms_identically(params, tmp_path):
    m = KernelPCA(2, fit_inverse_transform=True, alpha=1e-3, random_state=0, **params).fit(X)
    m.save(tmp_path / "m.zarr")
    loaded = kpca_dask.load(tmp_path / "m.zarr")
    assert loaded.preimage_ == m.preimage_
    assert loaded.get_params() == m.get_params()
    Z = m.transform(NEW)
    np.testing.assert_array_equal(loaded.transform(NEW), Z)
    np.testing.assert_array_equal(loaded.inverse_transform(Z), m.inverse_transform(Z))
    np.testing.assert_array_equal(loaded.preimage_indices_, m.preimage_indices_)
    root = zarr.open_group(str(tmp_path / "m.zarr"), mode="r")
    assert root.attrs["schema_version"] == SCHEMA_VERSION == 4
    json.dumps(dict(root.attrs))
    assert {"preimage_embedding", "preimage_dual_coef", "preimage_indices"} <= set(
        root.attrs["arrays"]
    )
    for _, arr in root.arrays():
        assert arr.dtype.kind in "fi"


def test_model_without_preimage_saves_no_preimage_arrays(tmp_path):
    KernelPCA(2, kernel="rbf").fit(X).save(tmp_path / "m.zarr")
    root = zarr.open_group(str(tmp_path / "m.zarr"), mode="r")
    assert not any(a.startswith("preimage") for a in root.attrs["arrays"])
    with pytest.raises(NotFittedError, match="fit_inverse_transform"):
        kpca_dask.load(tmp_path / "m.zarr").inverse_transform(np.zeros((1, 2)))


def test_schema_2_store_still_loads(tmp_path):
    """A store written before pre-images (schema 2: no such parameters) loads as before."""
    m = KernelPCA(2, kernel="rbf", gamma=2.0).fit(X)
    m.save(tmp_path / "m.zarr")
    g = zarr.open_group(str(tmp_path / "m.zarr"), mode="r+")
    params = {
        k: v
        for k, v in g.attrs["params"].items()
        if k
        not in (
            "fit_inverse_transform",
            "alpha",
            "preimage",
            "preimage_sample_size",
            "preimage_tol",
            "preimage_max_iter",
        )
    }
    attrs = dict(g.attrs)
    attrs.pop("extra", None)
    g.attrs.put({**attrs, "params": params, "schema_version": 2})
    with pytest.warns(UnverifiedAttributesWarning, match="schema 2 model"):
        loaded = kpca_dask.load(tmp_path / "m.zarr")
    np.testing.assert_array_equal(loaded.transform(NEW), m.transform(NEW))
    assert loaded.fit_inverse_transform is False and not hasattr(loaded, "dual_coef_")


def _saved(tmp_path):
    m = KernelPCA(2, kernel="rbf", gamma=2.0, fit_inverse_transform=True).fit(X)
    m.save(tmp_path / "m.zarr")
    return zarr.open_group(str(tmp_path / "m.zarr"), mode="r+")


def test_missing_preimage_arrays_are_refused(tmp_path):
    g = _saved(tmp_path)
    attrs = dict(g.attrs)
    attrs["arrays"] = [a for a in attrs["arrays"] if a != "preimage_dual_coef"]
    g.attrs.put(attrs)
    _reseal(g)
    with pytest.raises(ModelFormatError, match="lacks its pre-image arrays"):
        kpca_dask.load(tmp_path / "m.zarr")


def test_tampered_dual_coefficients_are_refused(tmp_path):
    g = _saved(tmp_path)
    g["preimage_dual_coef"][0, 0] = 1e6
    with pytest.raises(ModelFormatError, match="checksum mismatch for 'preimage_dual_coef'"):
        kpca_dask.load(tmp_path / "m.zarr")


def test_unknown_preimage_method_is_refused(tmp_path):
    g = _saved(tmp_path)
    g.attrs["extra"] = {"preimage": {"method": "os.system"}}
    _reseal(g)
    with pytest.raises(ModelFormatError, match="method 'os.system'"):
        kpca_dask.load(tmp_path / "m.zarr")


def _reseal(g):
    """Recompute the attributes' checksum after an edit: a forger who does so is still
    refused by the deeper check under test (without it, the checksum refuses first)."""
    from kpca_dask.persistence import attrs_sha256

    g.attrs["attrs_sha256"] = attrs_sha256(dict(g.attrs))
