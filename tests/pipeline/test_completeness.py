"""The check before publishing: every chunk of every published array is in the store
(pipeline/output/completeness.py), on real zarr stores in a tmp folder."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.output.completeness import (
    DENSE,
    IncompleteStoreError,
    check_complete,
    missing_chunks,
)
from pipeline.output.store import Location


def _group(tmp_path):
    loc = Location(str(tmp_path / "out.zarr"))
    g = loc.open_group("w")
    # zeros and ones: written dense, a chunk of zeros is stored like any other
    emb = g.create_array("embedding", shape=(50, 3), dtype="f8", chunks=(10, 3), config=DENSE)
    emb[...] = np.vstack([np.zeros((20, 3)), np.ones((30, 3))])
    lab = g.create_array("labels", shape=(50,), dtype="i8", chunks=(10,), config=DENSE)
    lab[...] = 0
    model = g.create_group("model")
    model.create_array("X_fit_", shape=(4, 2), dtype="f8", chunks=(2, 2), config=DENSE)[...] = 0
    return loc


def test_dense_arrays_with_zero_chunks_are_complete(tmp_path):
    loc = _group(tmp_path)
    assert missing_chunks(loc) == {}
    check_complete(loc)
    check_complete(loc, ["embedding", "labels", "model", "not-there"])


def test_a_missing_chunk_is_refused_naming_the_array(tmp_path):
    loc = _group(tmp_path)
    (tmp_path / "out.zarr" / "embedding" / "c" / "3" / "0").unlink()
    (tmp_path / "out.zarr" / "model" / "X_fit_" / "c" / "1" / "0").unlink()
    assert missing_chunks(loc) == {
        "embedding": {"missing": 1, "total": 5, "first": "c/3/0"},
        "model/X_fit_": {"missing": 1, "total": 2, "first": "c/1/0"},
    }
    with pytest.raises(IncompleteStoreError) as err:
        check_complete(loc, ["embedding", "labels", "model"])
    msg = str(err.value)
    assert "'embedding' lacks 1 of 5 chunks (first: c/3/0)" in msg
    assert "'model/X_fit_' lacks 1 of 2 chunks (first: c/1/0)" in msg
    assert "labels" not in msg and "\n" not in msg and "not published" in msg
    check_complete(loc, ["labels"])  # only what is asked for is checked


def test_without_write_empty_chunks_zero_chunks_would_look_lost(tmp_path):
    """Why every published array is written with DENSE: zarr's default skips a chunk equal
    to the fill value, which the check could not tell from a lost one."""
    loc = Location(str(tmp_path / "sparse.zarr"))
    g = loc.open_group("w")
    g.create_array("labels", shape=(20,), dtype="i8", chunks=(10,))[...] = 0
    with pytest.raises(IncompleteStoreError):
        check_complete(loc)


def test_transform_output_missing_a_chunk_is_not_published(tmp_path):
    """verify_transform_output (the check before a transform is swapped in) refuses a
    complete-looking output that lacks a chunk."""
    from pipeline.embed.transform import verify_transform_output

    loc = _group(tmp_path)
    loc.open_group("a").attrs.update({"kind": "kpca-dask-transform", "status": "complete"})
    verify_transform_output(loc, n_rows=50, n_components=3, parquet=False)
    (tmp_path / "out.zarr" / "labels" / "c" / "0").unlink()
    with pytest.raises(IncompleteStoreError, match="'labels' lacks 1 of 5 chunks"):
        verify_transform_output(loc, n_rows=50, n_components=3, parquet=False)
