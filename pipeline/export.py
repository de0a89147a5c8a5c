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

from .errors import RunCorruptError, RunError, RunExistsError, RunIncompleteError
from .layout import CHECKSUMMED, CHECKSUMMED_FILES, MANIFEST
from .store import Location, array_checksum, atomic_write_json, read_json
from .versions import Published

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
    "CHECKSUMMED",
    "CHECKSUMMED_FILES",
]

logger = logging.getLogger("pipeline")

SCHEMA_VERSION = 1
# MANIFEST, CHECKSUMMED (arrays) and CHECKSUMMED_FILES (folders): see pipeline/layout.py
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
    folder about to be written (the unpublished version of a run: pipeline/versions.py)."""
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
        s.create_array(name, shape=arr.shape, dtype="f8", chunks=arr.shape)[...] = arr


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
    """Checksum the published arrays (CHECKSUMMED plus ``arrays``, e.g. the denoised rows)
    and write the manifest (last, atomically)."""
    g = out.open_group("r")
    checksums = {}
    for name in CHECKSUMMED + tuple(arrays):
        if name in g:
            checksums[name] = array_checksum(g[name])
    model_attrs, _ = read_model_group(out.child("model").zarr_source())  # with its options
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
    what every reader of a run calls. Returns a :class:`pipeline.versions.Published`
    whose ``location`` is the folder of that version's arrays, ``model`` its model
    (``kpca_dask.load(run.model.zarr_source())``) and ``manifest`` its manifest.

    ``path`` is the output folder (local path or URL, read with ``storage_options``);
    an output written before versions, or a version folder itself, is read in place.
    Raises RunError (one line) as :func:`verify_run` does."""
    from .versions import resolve

    pub = resolve(path, version, storage_options)
    _verify(pub.location, pub.manifest, check_arrays=check_arrays)
    return pub


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


def _verify(out: Location, manifest: dict, *, check_arrays: bool = True) -> None:
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise RunCorruptError(
            f"{out} has manifest schema_version {manifest.get('schema_version')!r}; this "
            f"kpca-dask reads version {SCHEMA_VERSION}. Use a matching kpca-dask version."
        )
    if manifest.get("status") != "complete":
        raise RunIncompleteError(
            f"{out}: manifest status is {manifest.get('status')!r}, not "
            "'complete'; the run is not a result."
        )
    missing = [k for k in REQUIRED_FIELDS if k not in manifest]
    if not missing and not isinstance((manifest["model"] or {}).get("checksums"), dict):
        missing = ["model.checksums"]
    if missing:
        raise RunIncompleteError(
            f"{out}: the manifest is incomplete (missing {', '.join(missing)}); the run is not "
            "a result. Re-run the pipeline."
        )
    if check_arrays:
        g = out.open_group("r")
        for name, expected in manifest["checksums"].items():
            if name not in g:
                raise RunCorruptError(
                    f"{out}: array {name!r} listed in the manifest is missing; "
                    "do not use this run, re-run the pipeline."
                )
            if array_checksum(g[name]) != expected:
                raise RunCorruptError(
                    f"{out}: checksum mismatch for {name!r}: the array changed after the run "
                    "was published. Do not use this run; re-run the pipeline."
                )
        for rel, expected in (manifest.get("file_checksums") or {}).items():
            f = out.child(*rel.split("/"))
            if not f.exists():
                raise RunCorruptError(
                    f"{out}: file {rel!r} listed in the manifest is missing; "
                    "do not use this run, re-run the pipeline."
                )
            if _file_sha256(out, f.fs_path) != expected:
                raise RunCorruptError(
                    f"{out}: checksum mismatch for file {rel!r}: it changed after the run was "
                    "published. Do not use this run; re-run the pipeline."
                )
        try:
            attrs, _ = read_model_group(out.child("model").zarr_source())
        except Exception as exc:
            raise RunCorruptError(f"{out}: the model cannot be verified ({exc}).") from exc
        if attrs.get("checksums") != manifest["model"].get("checksums") or (
            "attrs_sha256" in manifest["model"]
            and attrs.get("attrs_sha256") != manifest["model"]["attrs_sha256"]
        ):
            raise RunCorruptError(
                f"{out}: the model was replaced after the run was published "
                "(its checksums differ from the manifest's); re-run the "
                "pipeline."
            )
