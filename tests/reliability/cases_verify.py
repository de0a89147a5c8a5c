"""Verified-read cases of the bad-input catalogue (issue 26): a deleted, truncated or altered
chunk, or an edited attribute, in a published run or in the training rows of its lineage
is refused in one line naming the object (pipeline/output/verify.py,
pipeline/output/lineage.py)."""

from __future__ import annotations

import json
import shutil

from ..published import version_dir
from .catalogue import RUN_D, Case, D, N, _cli, _new_rows
from .helpers import blobs


def _copy(ctx):
    run = ctx.dir / "run"
    shutil.copytree(ctx.run, run)
    return run


def _truncated_chunk(ctx):
    run = _copy(ctx)
    chunk = version_dir(run) / "embedding" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:20])
    return ["info", run]


def _deleted_chunk(ctx):
    run = _copy(ctx)
    (version_dir(run) / "embedding" / "c" / "1" / "0").unlink()
    return ["info", run]


def _edit_attrs(run, node, edit):
    meta = run / node / "zarr.json"
    doc = json.loads(meta.read_text())
    edit(doc["attributes"])
    meta.write_text(json.dumps(doc, indent=2))


def _columns_edited(ctx):
    run = _copy(ctx)
    _edit_attrs(version_dir(run), "embedding", lambda a: a["columns"].reverse())
    return ["info", run]


def _model_array_attrs(ctx):
    run = _copy(ctx)
    _edit_attrs(version_dir(run), "model/eigenvalues", lambda a: a.update(note="edited"))
    return ["transform", run, _new_rows(ctx, RUN_D), ctx.dir / "emb.zarr"]


def _spectrum_garbage(ctx):
    run = _copy(ctx)
    (version_dir(run) / "spectrum" / "eigenvalues" / "c" / "0").write_bytes(b"\x00not zstd" * 4)
    return ["transform", run, _new_rows(ctx, RUN_D), ctx.dir / "emb.zarr"]


def _base_run(ctx):
    """A run of its own at <dir>/base (its lineage is its own work/ingest.zarr)."""
    base = ctx.dir / "base"
    cfg = ctx.config(ctx.npy(blobs(N, D)), output={"path": str(base)})
    rc, err = _cli(["run", cfg, "--no-prefect"])
    assert rc == 0, err[-2000:]
    return base


def _update(ctx, base):
    new = ctx.npy(blobs(40, D, seed=1), "new.npy")
    out = ctx.dir / "v2"
    return ["update", base, new, "--output", out, "--policy", "refit", "--no-prefect"]


def _lineage_chunk_deleted(ctx):
    base = _base_run(ctx)
    (base / "work" / "ingest.zarr" / "X" / "c" / "1" / "0").unlink()
    return _update(ctx, base)


def _lineage_value_altered(ctx):
    import zarr

    base = _base_run(ctx)
    z = zarr.open_group(str(base / "work" / "ingest.zarr"), mode="r+")["X"]
    z[70, 1] = z[70, 1] + 1.0
    return _update(ctx, base)


CASES = [
    Case(
        "ver-info-truncated-chunk",
        "info",
        "a chunk of the published embedding truncated",
        _truncated_chunk,
        ("embedding/c/0/0 cannot be decoded", "truncated or damaged", "do not use this run"),
    ),
    Case(
        "ver-info-deleted-chunk",
        "info",
        "a chunk of the published embedding deleted (zarr would read zeros)",
        _deleted_chunk,
        ("embedding/c/1/0", "is missing", "zeros", "do not use this run"),
    ),
    Case(
        "ver-info-columns-edited",
        "info",
        "the embedding's columns attribute edited in its zarr.json",
        _columns_edited,
        ("the attributes of 'embedding'", "changed after the run was published"),
    ),
    Case(
        "ver-transform-model-array-attrs",
        "transform",
        "an attribute added to a model array's zarr.json",
        _model_array_attrs,
        ("the attributes of 'model/eigenvalues'", "do not use this run"),
    ),
    Case(
        "ver-transform-spectrum-garbage",
        "transform",
        "a spectrum chunk replaced by garbage bytes",
        _spectrum_garbage,
        ("spectrum/eigenvalues/c/0 cannot be decoded", "do not use this run"),
    ),
    Case(
        "ver-update-lineage-deleted",
        "update",
        "a chunk of the base run's training rows (work/ingest.zarr) deleted",
        _lineage_chunk_deleted,
        ("ingest.zarr/X/c/1/0", "is missing", "zeros", "re-run the full pipeline"),
    ),
    Case(
        "ver-update-lineage-altered",
        "update",
        "a value of the base run's training rows changed in place",
        _lineage_value_altered,
        ("ingest.zarr/X/c/1/0", "differs from the digest recorded", "values changed"),
    ),
]
