"""Test helpers for versioned outputs (pipeline/output/versions.py): where the published version
of a local output is, forging its manifest consistently, and every object's bytes."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.output.layout import HOLDS, LOCK, MANIFEST, WORK


def version_dir(out) -> Path:
    """The folder of the version the pointer ``<out>/manifest.json`` names (read without
    verifying anything: tests damage runs through it)."""
    out = Path(out)
    pointer = json.loads((out / MANIFEST).read_text())
    return out / pointer["version_path"] if "version_path" in pointer else out


def rewrite_manifests(out, fn) -> None:
    """Apply ``fn`` to the published manifest: the pointer's content and the version's own
    copy alike (a consistent forgery, as an editor of both files would make)."""
    out = Path(out)
    pointer = json.loads((out / MANIFEST).read_text())
    keys = ("version", "version_path", "history")
    kept = {k: pointer[k] for k in keys if k in pointer}
    new = fn({k: v for k, v in pointer.items() if k not in keys})
    (out / MANIFEST).write_text(json.dumps({**new, **kept}))
    if "version_path" in pointer:
        (out / pointer["version_path"] / MANIFEST).write_text(json.dumps(new))


def tree_bytes(out, exclude=(WORK, LOCK)) -> dict[str, bytes]:
    """Every file under a local output by relative path, with its bytes; ``exclude``:
    top-level names left out (resume state and the lock)."""
    out = Path(out)
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.relative_to(out).parts[0] not in exclude
    }


def store_tree_bytes(fs, prefix: str, exclude=(WORK, LOCK)) -> dict[str, bytes]:
    """:func:`tree_bytes` for an object-store prefix (``bucket/key``) through ``fs``, any
    fsspec filesystem (s3fs, gcsfs, adlfs)."""
    prefix = prefix.rstrip("/")
    fs.invalidate_cache()
    files = fs.find(prefix)
    out = {}
    for f in sorted(files):
        rel = str(f)[len(prefix) + 1 :]
        if rel.split("/")[0] in exclude:
            continue
        out[rel] = fs.cat_file(f)
    return out


#: the earlier name (the helper was written for s3 first)
s3_tree_bytes = store_tree_bytes


def without_holds(objects: dict[str, bytes], holders) -> dict[str, bytes]:
    """``objects`` (of :func:`tree_bytes`) less the output's ``holds/`` files, each checked
    to be a kpca hold of one of ``holders`` (output URLs): an update keeps a hold in every
    output its lineage reads, by design (docs/update.md, "Holds"), so a base that was
    only read differs from before by those files alone."""
    wanted = {str(h).rstrip("/") for h in holders}
    rest = {}
    for k, v in objects.items():
        if k.split("/")[0] != HOLDS:
            rest[k] = v
            continue
        hold = json.loads(v)
        assert hold.get("kind") == "hold" and hold.get("written_by") == "kpca-dask", (k, hold)
        assert hold["holder"] in wanted, (k, hold["holder"], sorted(wanted))
    return rest


def held_by(objects: dict[str, bytes], holder: str) -> dict:
    """The hold ``holder`` keeps in the output whose ``objects`` these are (an assertion
    error when there is none)."""
    found = [
        json.loads(v)
        for k, v in objects.items()
        if k.split("/")[0] == HOLDS and json.loads(v).get("holder") == holder.rstrip("/")
    ]
    assert len(found) == 1, (holder, sorted(k for k in objects if k.startswith(HOLDS)))
    return found[0]
