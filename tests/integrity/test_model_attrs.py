"""The model's checksums cover its attributes: an edited gamma is refused by ``load``,
``kpca info`` and ``kpca transform``, also when the editor re-seals the attributes' own
checksum (the run's manifest records it); older schemas load with a warning."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import zarr

import kpca_dask
from kpca_dask import KernelPCA, ModelFormatError
from kpca_dask.exceptions import UnverifiedAttributesWarning
from kpca_dask.persistence import SCHEMA_VERSION, attrs_sha256
from pipeline.output.export import RunCorruptError, verify_run

from ..reliability.helpers import blobs, kpca, make_published_run


@pytest.fixture(scope="module")
def published(tmp_path_factory, dask_cluster):
    from distributed import Client

    with Client(dask_cluster):
        return make_published_run(tmp_path_factory.mktemp("published"))


def _edit_gamma(model_dir, factor=2.0, reseal=False):
    meta = model_dir / "zarr.json"
    doc = json.loads(meta.read_text())
    a = doc["attributes"]
    a["kernel"]["gamma"] = a["kernel"]["gamma"] * factor
    if reseal:
        a["attrs_sha256"] = attrs_sha256(a)
    meta.write_text(json.dumps(doc, indent=2))


def test_edited_gamma_in_a_saved_model_is_refused(tmp_path):
    X = blobs(80, 3)
    m = KernelPCA(2, kernel="rbf", gamma=0.5).fit(X)
    m.save(tmp_path / "m")
    assert zarr.open_group(str(tmp_path / "m")).attrs["schema_version"] == SCHEMA_VERSION == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a current model loads without any warning
        np.testing.assert_array_equal(
            kpca_dask.load(tmp_path / "m").transform(X), m.transform(X)
        )
    _edit_gamma(tmp_path / "m")
    with pytest.raises(
        ModelFormatError,
        match="attribute checksum mismatch: its parameters, "
        "kernel or fitted values were modified",
    ):
        kpca_dask.load(tmp_path / "m")
    # the record removed: refused too (a schema 4 model always has it)
    meta = tmp_path / "m" / "zarr.json"
    doc = json.loads(meta.read_text())
    del doc["attributes"]["attrs_sha256"]
    meta.write_text(json.dumps(doc))
    with pytest.raises(ModelFormatError, match="no attribute checksum"):
        kpca_dask.load(tmp_path / "m")


def test_older_schema_loads_with_a_warning(tmp_path):
    X = blobs(80, 3)
    m = KernelPCA(2, kernel="rbf", gamma=0.5).fit(X)
    m.save(tmp_path / "m")
    g = zarr.open_group(str(tmp_path / "m"), mode="r+")
    attrs = {k: v for k, v in g.attrs.items() if k != "attrs_sha256"}
    g.attrs.put({**attrs, "schema_version": 3})
    with pytest.warns(UnverifiedAttributesWarning, match="schema 3 model.*cannot be verified"):
        loaded = kpca_dask.load(tmp_path / "m")
    np.testing.assert_array_equal(loaded.transform(X), m.transform(X))


@pytest.mark.parametrize("reseal", [False, True], ids=["edited", "edited-and-resealed"])
def test_edited_model_of_a_run_is_refused_by_info_and_transform(published, tmp_path, reseal):
    run = tmp_path / "run"
    shutil.copytree(published, run)
    canary = tmp_path / "canary.txt"
    canary.write_text("keep me")
    np.save(tmp_path / "new.npy", blobs(10, 5, seed=3))
    version = json.loads((run / "manifest.json").read_text())["version_path"]
    _edit_gamma(run / version / "model", reseal=reseal)  # the published version's model
    with pytest.raises(RunCorruptError, match="model"):
        verify_run(run)
    info = kpca("info", run)
    assert info.returncode == 2, info.stderr
    lines = [ln for ln in info.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "model" in lines[0], info.stderr
    if reseal:
        assert "replaced after the run was published" in lines[0]
    else:
        assert "attribute checksum mismatch" in lines[0]
    tr = kpca("transform", run, tmp_path / "new.npy", tmp_path / "emb.zarr")
    assert tr.returncode == 2 and not (tmp_path / "emb.zarr").exists(), tr.stderr
    assert canary.read_text() == "keep me"
    verify_run(published)  # the original is untouched
