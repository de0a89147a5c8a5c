"""Readers of a published run's version across retention, as docs/artifacts.md shows them
(``pipeline.open_run(out, version=...)``, then ``run.location.open_group("r")
["embedding"]`` and ``kpca_dask.load(run.model.zarr_source())``), with real runs on the
session's Dask cluster: within the grace period a reader reads its version whole; once
retention has deleted it, the reader fails in one line naming the output, the version and
the fix -- never an all-zero array, never "not a readable zarr group". And a lost or
damaged pointer of a run: ``open_run`` and ``kpca info`` read the newest verified version
without writing, the next run keeps every version and rewrites the pointer."""

from __future__ import annotations

import json

import numpy as np
import pytest

import kpca_dask
import pipeline
from pipeline.output.versions import VersionRemovedError, version_ids
from pipeline.runner.run import run_pipeline

from ..reliability.helpers import blobs, kpca, small_config


def _night(folder, out, gamma: float, **output) -> pipeline.output.versions.Published:
    run_pipeline(
        small_config(folder, out, kernel={"gamma": gamma}, output={"overwrite": True, **output})
    )
    return pipeline.open_run(out)


@pytest.fixture
def folder(tmp_path):
    np.save(tmp_path / "x.npy", blobs(300, 5))
    return tmp_path


def test_a_reader_of_a_removed_version_fails_in_one_line_never_zeros(folder, dask_client):
    """keep_versions 1: the next night expires the version a reader opened; with the
    default grace period (24 h) it still reads whole, model included; a night with
    retention_grace_hours 0 deletes it: the arrays the reader holds, a group it opens
    again and the model each fail in one line saying the version was removed by
    retention."""
    out = folder / "out"
    first = _night(folder, out, 0.05, keep_versions=1)
    run = pipeline.open_run(out, version=first.version)
    emb = run.location.open_group("r")["embedding"]
    want = emb[...]
    assert np.abs(want).max() > 0
    model_source = run.model.zarr_source()

    _night(folder, out, 0.06, keep_versions=1)  # expires the first night, keeps it 24 h
    assert first.version in version_ids(pipeline.output.store.Location(str(out)))
    np.testing.assert_array_equal(emb[...], want)
    np.testing.assert_array_equal(run.location.open_group("r")["embedding"][...], want)
    assert kpca_dask.load(run.model.zarr_source()).gamma == 0.05

    third = _night(folder, out, 0.07, keep_versions=1, retention_grace_hours=0)
    assert first.version not in version_ids(pipeline.output.store.Location(str(out)))
    attempts = {
        "the array opened before": lambda: emb[...],
        "the group opened again": lambda: run.location.open_group("r")["embedding"][...],
        "the model": lambda: kpca_dask.load(run.model.zarr_source()),
        "the model's store taken before": lambda: kpca_dask.load(model_source),
    }
    for what, attempt in attempts.items():
        with pytest.raises(Exception) as err:
            attempt()
        msg = str(err.value)
        assert "\n" not in msg, (what, msg)
        assert f"version {first.version} was removed by retention" in msg, (what, msg)
        assert str(out) in msg and "open the output again" in msg, (what, msg)
        assert "not a readable zarr group" not in msg, (what, msg)
    assert isinstance(err.value, (VersionRemovedError, kpca_dask.ModelFormatError))
    # the output opened again reads its current version
    again = pipeline.open_run(out)
    assert again.version == third.version
    assert kpca_dask.load(again.model.zarr_source()).gamma == 0.07


@pytest.mark.parametrize("damage", ["lost", pytest.param("truncated", marks=pytest.mark.slow)])
def test_a_run_with_a_lost_or_damaged_pointer_keeps_its_versions(folder, dask_client, damage):
    """The pointer deleted (or cut in half): ``open_run`` and ``kpca info`` read the
    newest verified version with one WARNING line and write nothing; the next run keeps
    every published version (none "left unpublished") and rewrites the pointer."""
    out = folder / "out"
    a = _night(folder, out, 0.05)
    b = _night(folder, out, 0.06)
    pointer = out / "manifest.json"
    if damage == "lost":
        pointer.unlink()
    else:
        text = pointer.read_text()
        pointer.write_text(text[: len(text) // 2])
    before = None if damage == "lost" else pointer.read_bytes()
    run = pipeline.open_run(out)
    assert run.version == b.version and run.manifest == b.manifest
    info = kpca("info", out, "--json")
    assert info.returncode == 0, info.stderr[-2000:]
    assert json.loads(info.stdout)["version"] == b.version
    warn = [ln for ln in info.stderr.splitlines() if "recovery" in ln]
    assert len(warn) == 1 and "read-only" in warn[0], info.stderr[-2000:]
    assert (pointer.read_bytes() if pointer.exists() else None) == before  # nothing written
    c = _night(folder, out, 0.07)
    assert set(version_ids(pipeline.output.store.Location(str(out)))) == {
        a.version,
        b.version,
        c.version,
    }
    assert [h["version"] for h in c.history] == [c.version, b.version, a.version]
    assert pipeline.open_run(out, version=a.version).manifest == a.manifest
