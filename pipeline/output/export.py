"""Export stage: spectrum, labels/ids/split copies, checksums and the manifest.

The manifest is the run's commit record: it is written last, atomically, and
only then is the run a result. ``begin_run`` removes an old manifest before a
new run touches anything (a reader never trusts a folder being rewritten);
``verify_run`` is what every reader calls.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np

from kpca_dask.persistence import read_model_group
from pipeline.errors import RunCorruptError, RunError, RunExistsError, RunIncompleteError

from .completeness import DENSE, check_complete
from .layout import CHECKSUMMED, CHECKSUMMED_FILES, MANIFEST, MODEL, SPECTRUM_ARRAYS
from .store import Location, array_checksum, atomic_write_json, read_json
from .verify import (
    INTEGRITY_VERSION,
    absent_chunks,
    attrs_digest,
    check_present,
    is_store_failure,
    open_checked_group,
    read_chunk,
    store_error,
)
from .versions import Published
from .versions import set_run_verifier as _set_run_verifier

__all__ = [
    "SCHEMA_VERSION",
    "RunError",
    "RunExistsError",
    "RunIncompleteError",
    "RunCorruptError",
    "begin_run",
    "write_spectrum",
    "write_manifest",
    "verify_run",
    "open_run",
    "file_checksums",
    "integrity_record",
    "CHECKSUMMED",
    "CHECKSUMMED_FILES",
]

logger = logging.getLogger("pipeline")

SCHEMA_VERSION = 1
# MANIFEST, CHECKSUMMED (arrays) and CHECKSUMMED_FILES (folders): see pipeline/output/layout.py
#: what a manifest of this schema version must hold; a manifest without them is incomplete
REQUIRED_FIELDS = (
    "schema_version",
    "status",
    "created",
    "config",
    "input",
    "model",
    "timings",
    "checksums",
)
_PACKAGES = (
    "kpca-dask",
    "dask",
    "distributed",
    "numpy",
    "scipy",
    "zarr",
    "scikit-learn",
    "prefect",
    "pandas",
    "pyarrow",
)


def _versions() -> dict[str, str]:
    out = {}
    for p in _PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            pass
    return out


def check_not_complete(out: Location, *, overwrite: bool) -> str | None:
    """Refuse a complete run at ``out`` unless ``overwrite``; writes nothing. Returns the
    manifest's status (None without a manifest)."""
    m = out.child(MANIFEST)
    if not m.exists():
        return None
    try:
        status = read_json(m).get("status")
    except Exception:
        status = "unreadable"
    if status == "complete" and not overwrite:
        raise RunExistsError(
            f"{out} already holds a complete run; choose another output.path or pass "
            "--overwrite (output.overwrite: true) to replace it."
        )
    return status


def begin_run(out: Location, *, overwrite: bool) -> None:
    """Refuse to clobber a complete run unless asked; then withdraw the manifest of the
    folder about to be written (the unpublished version of a run:
    pipeline/output/versions.py)."""
    m = out.child(MANIFEST)
    if m.exists():
        check_not_complete(out, overwrite=overwrite)
        m.remove(root=out)
    if out.exists() and out.is_local and not out.local_path.is_dir():
        raise RunError(
            f"output path {out} is a file, not a folder; choose another output.path."
        )
    out.makedirs()
    g = out.open_group("a")
    g.attrs.update({"kind": "kpca-dask-run", "schema_version": SCHEMA_VERSION})


def write_spectrum(out: Location, model: Any) -> None:
    g = out.open_group("a")
    s = g.require_group("spectrum")
    for name, arr in (
        ("eigenvalues", model.eigenvalues_),
        ("explained_variance_ratio", model.explained_variance_ratio_),
        ("residuals", model.residuals_),
    ):
        arr = np.asarray(arr, dtype=np.float64)
        if name in s:
            del s[name]
        s.create_array(name, shape=arr.shape, dtype="f8", chunks=arr.shape, config=DENSE)[
            ...
        ] = arr


def read_spectrum(out: Location) -> dict[str, np.ndarray]:
    """The spectrum :func:`write_spectrum` wrote, by name (``eigenvalues``,
    ``explained_variance_ratio``, ``residuals``)."""
    g = out.open_group("r")
    return {path.rsplit("/", 1)[-1]: np.asarray(g[path][...]) for path in SPECTRUM_ARRAYS}


def _file_sha256(loc: Location, path: str) -> str:
    h = hashlib.sha256()
    with loc.fs.open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


def file_checksums(out: Location) -> dict[str, str]:
    """SHA-256 of every file under the CHECKSUMMED_FILES folders, by relative path."""
    fs, root = out.fs, out.fs_path.rstrip("/")
    sums = {}
    for folder in CHECKSUMMED_FILES:
        base = f"{root}/{folder}"
        if not fs.exists(base):
            continue
        files = fs.find(base) if fs.isdir(base) else [base]
        for f in sorted(files):
            rel = str(f)[len(root) + 1 :] if str(f).startswith(root) else str(f)
            sums[rel] = _file_sha256(out, f)
    return sums


def write_manifest(
    out: Location,
    *,
    config: dict,
    ingest: dict,
    model: dict,
    timings: dict,
    arrays: tuple[str, ...] = (),
    extra: dict | None = None,
) -> dict:
    """Check that the published arrays (CHECKSUMMED plus ``arrays``, e.g. the denoised
    rows, and the model) hold every chunk (:func:`pipeline.output.completeness.check_complete`),
    checksum them and write the manifest (last, atomically)."""
    # nothing is marked complete with chunks missing (it would read as zeros)
    check_complete(out, CHECKSUMMED + tuple(arrays) + (MODEL,))
    g = out.open_group("r")
    checksums = {}
    for name in CHECKSUMMED + tuple(arrays):
        if name in g:
            checksums[name] = array_checksum(g[name])
    model_attrs, _ = read_model_group(out.child("model").zarr_source())  # with its options
    integrity = integrity_record(out, tuple(checksums))
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "status": "complete",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "packages": _versions(),
        "config": config,
        "input": ingest,
        "model": {
            **model,
            "checksums": model_attrs["checksums"],
            "attrs_sha256": model_attrs.get("attrs_sha256"),
        },
        "timings": timings,
        "checksums": checksums,
        "file_checksums": file_checksums(out),
        "integrity": integrity,
        **(extra or {}),
    }
    atomic_write_json(out.child(MANIFEST), manifest)
    logger.info("export: manifest written, run complete at %s", out)
    return manifest


def open_run(
    path: Location | str,
    storage_options: dict | None = None,
    *,
    version: str | None = None,
    check_arrays: bool = True,
) -> Published:
    """The published run at ``path`` (or its earlier published ``version``), verified:
    what every reader of a run calls. Returns a :class:`pipeline.output.versions.Published`
    whose ``location`` is the folder of that version's arrays, ``model`` its model
    (``kpca_dask.load(run.model.zarr_source())``) and ``manifest`` its manifest.

    ``path`` is the output folder (local path or URL, read with ``storage_options``);
    an output written before versions, or a version folder itself, is read in place.
    Raises RunError (one line) as :func:`verify_run` does."""
    from .versions import resolve

    pub = resolve(path, version, storage_options)
    _verify(pub.location, pub.manifest, check_arrays=check_arrays, label=pub.root)
    _hint_earlier_layout(pub)
    return pub


#: the outputs this process has looked at for an earlier release's layout (once each:
#: open_run is called many times per command, and on an object store a look is a request)
_LOOKED: set[str] = set()


def _hint_earlier_layout(pub: Published) -> None:
    """One WARNING line (once per output and process) when the output read is in an
    earlier release's layout, or still holds its top-level paths
    (pipeline/output/migrate.py)."""
    from .layout import GROUP_FILE

    root = pub.root
    if root.url in _LOOKED:
        return
    _LOOKED.add(root.url)
    if pub.version is not None and not root.child(GROUP_FILE).exists():
        return  # the current layout: no group file at the top level (one look-up)
    from .earlier_layout import reader_hint

    line = reader_hint(root, pub.version)
    if line is not None:
        logger.warning("open_run: %s", line)


def integrity_record(out: Location, names: tuple[str, ...]) -> dict[str, Any]:
    """The manifest's ``integrity`` record of the run at ``out`` (any prefix it is
    published under): the attribute digest of each checksummed array, of the model group
    and of each model array (``model/<name>``), and the chunks zarr did not write because
    they equal the fill value (``absent_chunks``; any other absent chunk is damage)."""
    g = out.open_group("r")
    attrs: dict[str, str] = {}
    absent: dict[str, list[str]] = {}
    nodes = [(name, g[name]) for name in names if name in g]
    mg = out.child("model").open_group("r")
    attrs["model"] = attrs_digest(mg)
    nodes += [(f"model/{k}", mg[k]) for k in sorted(mg.array_keys())]
    for name, z in nodes:
        attrs[name] = attrs_digest(z)
        keys = absent_chunks(z)
        if keys:
            absent[name] = keys
    return {"version": INTEGRITY_VERSION, "attrs": attrs, "absent_chunks": absent}


_DO_NOT_USE = "do not use this run; re-run the pipeline (or restore the run from a copy)"


def _check_integrity(
    out: Location,
    g: Any,
    record: dict[str, Any],
    *,
    model: bool,
    attrs: bool = True,
    chunks: bool = True,
) -> None:
    """Attribute digests (``attrs``) and chunk presence (``chunks``) of the run's arrays,
    or (``model``) of its model group and arrays, against the manifest's ``integrity``
    record: RunCorruptError / CorruptObjectError naming the array, attribute or chunk."""
    if record.get("version") != INTEGRITY_VERSION:
        raise RunCorruptError(
            f"{out}: the manifest's integrity record has version {record.get('version')!r}; "
            f"this kpca-dask reads version {INTEGRITY_VERSION}. Use a matching kpca-dask."
        )
    absent = record.get("absent_chunks") or {}
    mg = None
    for name, expected in sorted((record.get("attrs") or {}).items()):
        in_model = name == "model" or name.startswith("model/")
        if in_model != model:
            continue
        if in_model:
            if mg is None:
                mg = open_checked_group(out.child("model"), fix=_DO_NOT_USE)
            node = mg if name == "model" else mg.get(name[len("model/") :])
        else:
            node = g.get(name)
        if node is None:
            raise RunCorruptError(
                f"{out}: {name!r} listed in the manifest is missing; {_DO_NOT_USE}."
            )
        if attrs and attrs_digest(node) != expected:
            raise RunCorruptError(
                f"{out}: the attributes of {name!r} (its zarr.json) changed after the run was "
                f"published; {_DO_NOT_USE}."
            )
        if chunks and name != "model":
            check_present(node, allowed=absent.get(name), fix=_DO_NOT_USE)


def _locate_bad_model_chunk(out: Location) -> None:
    """After the model failed to load: a CorruptObjectError naming the first chunk of a
    model array that cannot be decoded (if that is why), else nothing."""
    mg = open_checked_group(out.child("model"), fix=_DO_NOT_USE)
    for name in sorted(mg.array_keys()):
        z = mg[name]
        for idx in np.ndindex(*_numblocks(z)):
            read_chunk(z, idx, fix=_DO_NOT_USE)


def _numblocks(z: Any) -> tuple[int, ...]:
    """The block grid of ``z.chunks`` (what :func:`pipeline.output.verify.read_chunk`
    indexes)."""
    return tuple(-(-s // c) for s, c in zip(z.shape, z.chunks))


def verify_run(
    out: Location | str, *, check_arrays: bool = True, version: str | None = None
) -> dict:
    """The manifest of a complete, intact run -- or RunError saying what is wrong.

    Refused, each with its own message: no folder, no manifest (the run did not
    finish), a manifest that is not valid JSON or lacks required fields
    (incomplete), an unknown schema version, a status other than complete, and
    (``check_arrays``) an array, file or model whose checksum does not match.
    ``out`` is the output folder: the published version is verified (``version``: an
    earlier published one).
    """
    return open_run(out, version=version, check_arrays=check_arrays).manifest


def _verify(
    out: Location, manifest: dict, *, check_arrays: bool = True, label: Location | None = None
) -> None:
    """Check the run whose arrays are at ``out``; messages name ``label`` (the output)."""
    label = out if label is None else label
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise RunCorruptError(
            f"{label} has manifest schema_version {manifest.get('schema_version')!r}; this "
            f"kpca-dask reads version {SCHEMA_VERSION}. Use a matching kpca-dask version."
        )
    if manifest.get("status") != "complete":
        raise RunIncompleteError(
            f"{label}: manifest status is {manifest.get('status')!r}, not "
            "'complete'; the run is not a result."
        )
    missing = [k for k in REQUIRED_FIELDS if k not in manifest]
    if not missing and not isinstance((manifest["model"] or {}).get("checksums"), dict):
        missing = ["model.checksums"]
    if missing:
        raise RunIncompleteError(
            f"{label}: the manifest is incomplete (missing {', '.join(missing)}); the run is "
            "not a result. Re-run the pipeline."
        )
    if check_arrays:
        g = open_checked_group(out, fix=_DO_NOT_USE)
        record = manifest.get("integrity")  # manifests written before it: values only
        if record is not None:
            _check_integrity(out, g, record or {}, model=False)
        for name, expected in manifest["checksums"].items():
            if name not in g:
                raise RunCorruptError(
                    f"{label}: array {name!r} listed in the manifest is missing; "
                    "do not use this run, re-run the pipeline."
                )
            if array_checksum(g[name], fix=_DO_NOT_USE) != expected:
                raise RunCorruptError(
                    f"{label}: checksum mismatch for {name!r}: the array changed after the run "
                    "was published. Do not use this run; re-run the pipeline."
                )
        for rel, expected in (manifest.get("file_checksums") or {}).items():
            f = out.child(*rel.split("/"))
            if not f.exists():
                raise RunCorruptError(
                    f"{label}: file {rel!r} listed in the manifest is missing; "
                    "do not use this run, re-run the pipeline."
                )
            if _file_sha256(out, f.fs_path) != expected:
                raise RunCorruptError(
                    f"{label}: checksum mismatch for file {rel!r}: it changed after the run "
                    "was published. Do not use this run; re-run the pipeline."
                )
        if record is not None:  # every model chunk there before it is read
            _check_integrity(out, g, record or {}, model=True, attrs=False)
        try:
            attrs, _ = read_model_group(out.child("model").zarr_source())
        except Exception as exc:
            if is_store_failure(exc):
                raise store_error("read", f"{out}/model", exc) from exc
            _locate_bad_model_chunk(out)  # a chunk that cannot be decoded: named
            msg = " ".join(str(exc).split())
            raise RunCorruptError(f"{label}: the model cannot be verified ({msg}).") from exc
        if attrs.get("checksums") != manifest["model"].get("checksums") or (
            "attrs_sha256" in manifest["model"]
            and attrs.get("attrs_sha256") != manifest["model"]["attrs_sha256"]
        ):
            raise RunCorruptError(
                f"{label}: the model was replaced after the run was published "
                "(its checksums differ from the manifest's); re-run the "
                "pipeline."
            )
        if record is not None:  # the model's arrays' own attributes (zarr.json)
            _check_integrity(out, g, record or {}, model=True, chunks=False)


# the checks recovery applies to a run's version before it rebuilds a pointer from it
# (pipeline/output/versions.py cannot import this module, which imports it)
def _verify_version(loc: Location, manifest: dict) -> None:
    _verify(loc, manifest, check_arrays=True, label=loc)


_set_run_verifier(_verify_version)
