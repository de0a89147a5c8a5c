"""Whether an ingest store still stands for its input: the source's signature (files,
sizes, modification times, and a local source's bytes), the chunk digests recorded when
it was written, and the content fingerprint (pipeline/data/ingest.py writes the store)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np

from kpca_dask.validation import describe_missing_chunks, missing_zarr_chunks
from pipeline.config import ChunkConfig, InputConfig
from pipeline.errors import CorruptObjectError
from pipeline.output import Location, checked_array, digest_blocks
from pipeline.runtime import compute

logger = logging.getLogger("pipeline")

__all__ = [
    "file_stats",
    "fingerprint_from_digests",
    "hex_digests",
    "keep_held_rows",
    "source_signature",
    "stale_ingest",
    "store_digests",
    "store_problem",
]


def file_stats(files: dict[str, dict]) -> list[list[Any]]:
    """``[name, size, modification time or ETag]`` of each file of an fsspec listing
    (``find(detail=True)``), sorted: what tells an input's files apart without reading
    them (the ingest store's signature, the flow's cache key)."""
    return sorted(
        [
            str(k),
            v.get("size"),
            str(
                v.get("mtime")
                or v.get("LastModified")
                or v.get("ETag")
                or v.get("created")
                or ""
            ),
        ]
        for k, v in files.items()
    )


def source_signature(cfg: InputConfig, chunks: ChunkConfig) -> dict[str, Any]:
    loc = Location(cfg.path, cfg.storage_options)
    fs, path = loc.fs, loc.fs_path
    files = fs.find(path, detail=True) if fs.isdir(path) else {path: fs.info(path)}
    stats = file_stats(files)
    sig = {
        "config": cfg.model_dump(mode="json"),
        "target_chunk_mb": chunks.target_chunk_mb,
        "files": stats,
        "content": _content_hash(loc, sorted(files)) if loc.is_local else None,
    }
    return json.loads(json.dumps(sig))  # the form it takes once stored in zarr attributes


def _content_hash(loc: Location, files: list[str]) -> str:
    """BLAKE2b of a local source's bytes (names relative to it): a file edited in place with
    its size and modification time kept is not taken for the ingested one."""
    h = hashlib.blake2b(digest_size=20)
    root = loc.fs_path.rstrip("/")
    for f in files:
        h.update(str(f)[len(root) :].encode() + b"\0")
        with loc.fs.open(f, "rb") as fh:
            while block := fh.read(1 << 22):
                h.update(block)
    return "blake2b:" + h.hexdigest()


def store_digests(arrays: dict[str, da.Array]) -> dict[str, da.Array]:
    return {k: digest_blocks(a) for k, a in arrays.items()}


def hex_digests(digests: dict[str, np.ndarray]) -> dict[str, str]:
    return {k: np.ascontiguousarray(v).tobytes().hex() for k, v in sorted(digests.items())}


def store_problem(store: Location, attrs: dict[str, Any]) -> str | None:
    """Why a complete ingest store cannot be reused as it is (None: it is intact): a chunk
    file missing (zarr would read zeros) or a chunk whose content changed."""
    g = store.open_group("r")
    want = attrs.get("digests")
    if not isinstance(want, dict) or set(want) != set(g.array_keys()):
        return "it records no chunk digests (written by an older version)"
    arrays = {}
    for name in sorted(want):
        missing = missing_zarr_chunks(g[name])
        if missing:
            return f"array {name!r}: {describe_missing_chunks(g[name], missing)}"
        arrays[name] = checked_array(g[name])
    try:
        got = (
            hex_digests(
                dict(zip(arrays, compute(*store_digests(arrays).values(), label="verify")))
            )
            if arrays
            else {}
        )
    except CorruptObjectError as exc:  # a chunk that cannot be decoded: rebuilt
        return str(exc)
    bad = sorted(k for k in want if got.get(k) != want[k])
    return f"the content of {bad} differs from what was written" if bad else None


def stale_ingest(cfg: InputConfig, chunks: ChunkConfig, store: Location) -> str | None:
    """Why the ingest store cannot stand for this input now (None: it can): incomplete,
    built from other input or config, or damaged (a chunk missing or changed). The same
    test the ingest stage applies before reusing it; the flows' cache asks it too."""
    try:
        attrs = dict(store.open_group("r").attrs)
    except Exception as exc:  # noqa: BLE001 - absent or unreadable: not reusable
        return f"the ingest store cannot be opened ({type(exc).__name__})"
    if attrs.get("status") != "complete":
        return "the ingest store is incomplete"
    if attrs.get("source") != source_signature(cfg, chunks):
        return "the input or its config changed since it was ingested"
    problem = store_problem(store, attrs)
    return f"the ingest store is damaged: {problem}" if problem else None


def fingerprint_from_digests(arrays, digest_values, extra) -> str:
    h = hashlib.blake2b(digest_size=20)
    for k in sorted(arrays):
        a = arrays[k]
        h.update(f"{k}:{a.shape}:{a.dtype.str}".encode())
        h.update(np.ascontiguousarray(digest_values[k]).tobytes())
    h.update(json.dumps(extra, sort_keys=True).encode())
    return "blake2b:" + h.hexdigest()


# ------------------------------------------------ rows a hold needs (issue 36)
def keep_held_rows(store: Location) -> None:
    """Before the ingest stage rebuilds ``store`` (``<out>/work/ingest.zarr``): when a
    hold of another output's lineage names the rows it holds now (their fingerprint,
    pipeline/output/lineage.py), keep them at ``<out>/work/ingest/<fingerprint>.zarr`` -- hard
    links on local disk (no bytes copied), a server-side copy on an object store -- so the
    lineage still reads them; and remove the kept copies no hold names any more (only
    ours). The writer calls this holding the output's lock."""
    from pipeline.output import fingerprint_at, held_rows, kept_rows_location

    probe = kept_rows_location(store, "x")
    if probe is None:  # not an output's ingest store (a transform's, a test's)
        return
    folder = Location.at(probe.url.rpartition("/")[0], store.storage_options)
    root = Location.at(store.url.rstrip("/").rsplit("/", 2)[0], store.storage_options)
    held = held_rows(root)
    fp = fingerprint_at(store)
    if fp is not None and fp in held:
        _keep(store, kept_rows_location(store, fp), fp)
    _drop_unheld(folder, {kept_rows_location(store, f).url for f in held})


def _keep(store: Location, kept: Location, fp: str) -> None:
    """``kept`` as a copy of the ingest store ``store`` (its group metadata last, so a
    copy cut short is no complete store); nothing when a complete copy is there."""
    from kpca_dask.removal import MARKER_FILE
    from pipeline.output import fingerprint_at, mark_folder

    if fingerprint_at(kept) == fp:
        return
    if kept.exists():  # a copy cut short by a killed writer: ours (marked first)
        kept.remove(root=kept)
    mark_folder(kept, "ingest-rows")
    if store.is_local:
        from pipeline.output import link_tree

        src, dst = store.local_path, kept.local_path
        for e in sorted(Path(src).iterdir(), key=lambda e: (e.name == "zarr.json", e.name)):
            if e.name != MARKER_FILE:
                link_tree(e, dst / e.name, src, str(src))
    else:
        fs, s, d = store.fs, store.fs_path.rstrip("/"), kept.fs_path.rstrip("/")
        files = sorted(
            (str(f) for f in fs.find(s) if not str(f).endswith(f"/{MARKER_FILE}")),
            key=lambda f: f == f"{s}/zarr.json",
        )
        body = [f for f in files if f != f"{s}/zarr.json"]
        if body:
            fs.copy(body, [d + f[len(s) :] for f in body])
        fs.copy(f"{s}/zarr.json", f"{d}/zarr.json")
        kept.refresh()
    if fingerprint_at(kept) != fp:
        raise CorruptObjectError(
            f"the copy {kept} of the ingest store {store} that a later update's lineage "
            "needs is not complete; re-run: the ingest stage copies it again."
        )
    logger.info(
        "ingest: kept the rows of %s (fingerprint %s) at %s: a hold names them", store, fp, kept
    )


def _drop_unheld(folder: Location, needed: set[str]) -> None:
    """Remove each kept copy under ``<out>/work/ingest/`` that no hold names (ours only)."""
    try:
        if not folder.is_local:
            folder.refresh()
        if not folder.exists():
            return
        names = [
            str(n).rstrip("/").rpartition("/")[2]
            for n in folder.fs.ls(folder.fs_path, detail=False)
        ]
    except FileNotFoundError:
        return
    for name in sorted(names):
        loc = folder.child(name)
        if name.endswith(".zarr") and loc.url not in needed:
            if loc.remove(root=folder):
                logger.info("ingest: removed %s, rows no hold needs any more", loc)
