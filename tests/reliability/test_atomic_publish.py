"""Atomic publish: the manifest is written last, by an atomic rename, and every reader
(``verify_run``, ``kpca info``, ``kpca transform``, ``kpca_dask.load``) refuses an
artifact whose manifest is missing, incomplete, of an unknown schema version, or whose
checksums do not match -- with a message saying which."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import zarr

import kpca_dask
from kpca_dask.exceptions import ModelFormatError
from pipeline.embed.transform import load_model
from pipeline.output.export import MANIFEST, RunError, verify_run
from pipeline.runner.run import stage_begin
from tests.published import rewrite_manifests, version_dir

from .helpers import ROOT, env, make_published_run, small_config


def cli(*args) -> tuple[int, str]:
    """``kpca ARGS`` in this process (the real parser, commands and error mapping)."""
    from flows.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in args])
    return rc, err.getvalue()


@pytest.fixture(scope="module")
def published(tmp_path_factory, dask_cluster):
    """A complete, verified run of 300 rows (made once; each test works on a copy)."""
    from distributed import Client

    folder = tmp_path_factory.mktemp("published")
    with Client(dask_cluster):
        make_published_run(folder)
    return folder


@pytest.fixture
def run_copy(published, tmp_path):
    shutil.copytree(published / "out", tmp_path / "run")
    return tmp_path / "run"


def test_manifest_is_the_last_file_written(published):
    """Every array chunk, model file, Parquet part and work store predates the manifest."""
    out = published / "out"
    t_manifest = (out / MANIFEST).stat().st_mtime_ns
    others = [p for p in out.rglob("*") if p.is_file() and p.name != MANIFEST]
    assert len(others) > 20
    late = [str(p) for p in others if p.stat().st_mtime_ns > t_manifest]
    assert not late


def test_killed_while_writing_the_manifest_publishes_nothing(published, tmp_path):
    """A process killed after writing the manifest's bytes but before the rename leaves no
    manifest.json (only a temporary file readers ignore): readers read the version that
    was published, never the half-renamed pointer."""
    shutil.copytree(published / "out", tmp_path / "run")
    out = tmp_path / "run"
    (out / MANIFEST).unlink()
    script = f"""
import os, signal
from pipeline.output.store import Location, atomic_write_json
real_fsync = os.fsync
def fsync_then_die(fd):
    real_fsync(fd)  # the whole manifest is on disk under its temporary name
    os.kill(os.getpid(), signal.SIGKILL)
os.fsync = fsync_then_die
manifest = Location({str(out / MANIFEST)!r})
atomic_write_json(manifest, {{"status": "complete", "pad": "x" * 100000}})
"""
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env(), timeout=60)
    assert res.returncode == -signal.SIGKILL
    assert not (out / MANIFEST).exists()
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(f".{MANIFEST}.")]
    assert leftovers and os.path.getsize(out / leftovers[0]) > 100000  # written, not renamed
    # readers never take the temporary file: they read the version published before
    # (its own manifest: the lost pointer is rebuilt from it, issue 36)
    m = verify_run(out)
    assert m["status"] == "complete" and "pad" not in m
    assert m == verify_run(published / "out")


def test_a_rerun_keeps_the_old_result_published_while_it_writes(published, tmp_path):
    """With overwrite, a re-run writes a new version nothing points to: the old result
    stays published and verifies, and the version being written has no manifest (a
    reader never takes it for a result)."""
    from pipeline.output.layout import run_layout
    from pipeline.runner.run import run_lock

    shutil.copytree(published / "out", tmp_path / "run")
    before = verify_run(tmp_path / "run")
    cfg = small_config(published, tmp_path / "run", output={"overwrite": True})
    with run_lock(cfg):
        stage_begin(cfg)
        writing = run_layout(cfg).out.local_path
        assert writing != version_dir(tmp_path / "run")
        assert not (writing / MANIFEST).exists()
        assert verify_run(tmp_path / "run") == before
        with pytest.raises(RunError, match="no manifest.json"):
            verify_run(writing)


def _rewrite_manifest(out, fn):
    rewrite_manifests(out, fn)


def _tamper_model_array(out, name="eigenvalues"):
    z = zarr.open_group(str(version_dir(out) / "model"), mode="r+")[name]
    a = z[...]
    a.flat[0] += 1e-3
    z[...] = a


def _replace_model(out):
    """A different, self-consistent model (its own checksums updated)."""
    from kpca_dask.persistence import array_sha256, attrs_sha256

    g = zarr.open_group(str(version_dir(out) / "model"), mode="r+")
    a = g["eigenvalues"][...] * 2
    g["eigenvalues"][...] = a
    sums = dict(g.attrs["checksums"])
    sums["eigenvalues"] = array_sha256(a)
    g.attrs["checksums"] = sums
    g.attrs["attrs_sha256"] = attrs_sha256(dict(g.attrs))  # its attributes re-sealed too


def _tamper_parquet(out):
    part = sorted((version_dir(out) / "embedding.parquet").glob("*.parquet"))[0]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))


def _no_complete_version(out: Path) -> None:
    """Every version's own manifest gone too: nothing verified to recover the pointer
    from (a lost or damaged pointer beside an intact version is rebuilt from it:
    tests/integrity/test_lifecycle_*.py)."""
    for m in (out / "versions").glob(f"*/{MANIFEST}"):
        m.unlink()


def _lose_pointer(out: Path) -> None:
    (out / MANIFEST).unlink()
    _no_complete_version(out)


def _truncate_pointer(out: Path) -> None:
    (out / MANIFEST).write_text((out / MANIFEST).read_text()[:200])
    _no_complete_version(out)


DEFECTS = {
    "missing manifest": (_lose_pointer, "no manifest.json: the run did not finish"),
    "truncated manifest": (_truncate_pointer, "is damaged (not valid JSON)"),
    "manifest without checksums": (
        lambda out: _rewrite_manifest(
            out, lambda m: {k: v for k, v in m.items() if k != "checksums"}
        ),
        "the manifest is incomplete (missing checksums)",
    ),
    "unknown schema version": (
        lambda out: _rewrite_manifest(out, lambda m: {**m, "schema_version": 99}),
        "schema_version 99; this kpca-dask reads",
    ),
    "status not complete": (
        lambda out: _rewrite_manifest(out, lambda m: {**m, "status": "running"}),
        "status is 'running', not 'complete'",
    ),
    "embedding changed": (
        lambda out: zarr.open_group(str(version_dir(out)), mode="r+")["embedding"].__setitem__(
            (0, 0), 42.0
        ),
        "checksum mismatch for 'embedding'",
    ),
    "parquet file changed": (_tamper_parquet, "checksum mismatch for file 'embedding.parquet/"),
    "model array changed": (_tamper_model_array, "checksum mismatch for 'eigenvalues'"),
    "model replaced": (_replace_model, "the model was replaced after the run was published"),
}


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_every_reader_refuses_a_damaged_run_and_says_why(run_copy, published, tmp_path, defect):
    damage, message = DEFECTS[defect]
    model_dir = version_dir(run_copy) / "model"
    damage(run_copy)
    with pytest.raises(RunError, match=message.replace("(", r"\(").replace(")", r"\)")):
        verify_run(run_copy)
    with pytest.raises(RunError, match="."):
        load_model(str(model_dir))  # a run's model/ is trusted only with its run
    rc, err = cli("info", run_copy)
    assert rc == 2 and message in err and "Traceback" not in err
    for model in (run_copy, model_dir):
        target = tmp_path / "emb.zarr"
        rc, err = cli("transform", model, published / "new.npy", target)
        assert rc == 2 and message in err, err
        assert not target.exists()


def test_kpca_dask_load_refuses_a_damaged_model_and_says_why(run_copy):
    """``kpca_dask.load`` verifies a model folder's own record (its attributes play the
    manifest's part; kpca_dask knows nothing of runs)."""
    model = version_dir(run_copy) / "model"
    kpca_dask.load(model)  # intact
    g = zarr.open_group(str(model), mode="r+")
    attrs = dict(g.attrs)

    _tamper_model_array(run_copy, "eigenvectors")
    with pytest.raises(ModelFormatError, match="checksum mismatch for 'eigenvectors'"):
        kpca_dask.load(model)
    g.attrs.put({**attrs, "schema_version": 99})
    with pytest.raises(ModelFormatError, match="schema_version 99"):
        kpca_dask.load(model)
    g.attrs.put({k: v for k, v in attrs.items() if k != "format"})  # attributes come last
    with pytest.raises(ModelFormatError, match="not a kpca-dask model .* incomplete"):
        kpca_dask.load(model)
    g.attrs.put({**attrs, "arrays": [a for a in attrs["arrays"] if a != "row_means"]})
    with pytest.raises(ModelFormatError, match="attribute checksum mismatch"):
        kpca_dask.load(model)
    from kpca_dask.persistence import attrs_sha256

    g.attrs["attrs_sha256"] = attrs_sha256(dict(g.attrs))  # a forger who re-seals them
    with pytest.raises(ModelFormatError, match=r"lacks the arrays \['row_means'\]"):
        kpca_dask.load(model)
    shutil.rmtree(model)
    with pytest.raises(ModelFormatError, match="does not exist"):
        kpca_dask.load(model)
