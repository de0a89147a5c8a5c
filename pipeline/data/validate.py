"""The checks before anything starts: ``kpca validate CONFIG``, and the first thing ``kpca run``
does, before a Prefect API or a Dask cluster is started.

:func:`validate` reads the input's header and a small sample of rows (a few CSV lines,
the first Parquet batch, an NPY header and first rows, a zarr array's metadata) for the
cheap checks, then every row of a CSV, Parquet or NPY input once, streaming
(pipeline/data/scan.py: row count, NaN/inf, text in numeric columns, missing labels, missing
or repeated ids, each with the exact row and column of its first occurrence); and it
probes the output for writing, removing only what the probe created. It returns a list of
:class:`Finding` (one line each, naming the problem and the fix); errors stop a run
before anything is written.

This module imports neither dask, distributed, zarr nor Prefect (a test checks it): a
wrong path or column is reported in about a second, bad data after one streaming pass
(cost in docs/config.md, "input"), never after a cluster has started. A zarr array's
values are checked at ingest.

This module holds the entry points and the output checks; the input checks are in
pipeline/data/checks/ (findings, inputs, tables, rows).
"""

from __future__ import annotations

import json
import posixpath
import uuid
from typing import Any

from pipeline.config import PipelineConfig

from .checks.findings import (
    SAMPLE_ROWS,
    Finding,
    PrestartError,
    Stop,
    Unreachable,
    Validation,
    open_fs,
    short,
    unreachable,
)
from .checks.inputs import check_evaluate, check_input

__all__ = [
    "SAMPLE_ROWS",
    "Finding",
    "PrestartError",
    "Validation",
    "validate",
    "validate_input",
]

_MANIFEST = "manifest.json"  # pipeline/output/layout.py's MANIFEST (that module imports dask)


# ------------------------------------------------------------------------ the output
def _check_output(cfg: PipelineConfig, v: Validation, *, probe: bool) -> None:
    raw = str(cfg.output.path).strip()
    bare = raw.removeprefix("file://").rstrip("/")
    if raw.rstrip("/") in ("", ".", "..") or bare in ("", ".", ".."):
        raise Stop(
            f"output.path {cfg.output.path!r} names no folder of its own (empty or '.'); "
            "set output.path to a new folder, e.g. kpca-output."
        )
    remote = "://" in raw and not raw.startswith("file://")
    opts = dict(getattr(cfg.output, "storage_options", None) or {}) if remote else {}
    try:
        fs, out = open_fs(raw, opts)
    except Exception as exc:  # noqa: BLE001 - unknown protocol, missing backend
        raise Stop(
            f"cannot open output {raw!r} ({type(exc).__name__}: {short(exc)}); check "
            "output.path (and install the fsspec backend for its URL scheme)."
        ) from None
    local = not remote
    _check_not_overlapping(cfg, out, local)
    try:
        is_file = fs.isfile(out)
        manifest = posixpath.join(out, _MANIFEST)
        status = None
        if not is_file and fs.exists(manifest):
            try:
                with fs.open(manifest, "rb") as f:
                    status = json.loads(f.read()).get("status")
            except Exception:  # noqa: BLE001 - a broken manifest is not a complete run
                status = "unreadable"
    except PermissionError as exc:
        raise Stop(
            f"cannot look into output {raw!r}: permission denied ({short(exc)}); set "
            "output.path (or --output) to a folder this user may write."
        ) from None
    except Exception as exc:  # noqa: BLE001 - network, credentials
        kind = unreachable(exc)
        fix = (
            "the store did not answer (network or server); re-run when it is reachable."
            if kind is Unreachable
            else "check the URL, the network and the credentials in the environment."
        )
        raise kind(
            f"cannot reach output {raw!r} ({type(exc).__name__}: {short(exc)}); {fix}"
        ) from None
    if is_file:
        raise Stop(f"output path {raw} is a file, not a folder; choose another output.path.")
    if status == "complete":
        if cfg.output.overwrite:
            v.findings.append(
                Finding(
                    "run",
                    f"{raw} holds a complete run; it is replaced when the new one is "
                    "published (output.overwrite: true; only changed stages run again "
                    "with Prefect)",
                    level="note",
                )
            )
        else:
            v.findings.append(
                Finding(
                    "run",
                    f"{raw} already holds a complete run; choose another output.path or "
                    "pass --overwrite (output.overwrite: true) to replace it.",
                )
            )
    elif status is not None:
        v.findings.append(
            Finding(
                "run",
                f"{raw} holds an unfinished run ({status}); this run resumes it",
                level="note",
            )
        )
    if probe:
        _probe_writable(raw, fs, out, local)


def _check_not_overlapping(cfg: PipelineConfig, out: str, local: bool) -> None:
    """The output must not be the input, inside it, or hold it (local paths)."""
    from pathlib import Path

    src = cfg.input.path
    if not local or ("://" in src and not src.startswith("file://")):
        return
    o = Path(out).resolve()
    i = Path(src.removeprefix("file://")).resolve()
    if o == i or o in i.parents or i in o.parents:
        raise Stop(
            f"output.path {cfg.output.path} is, holds or lies inside the input {src}; write "
            "the output somewhere else (the input is never overwritten)."
        )


def _unanswered(raw: str, exc: BaseException) -> Unreachable:
    return Unreachable(
        f"cannot write to output {raw} ({type(exc).__name__}: {short(exc)}): the store did "
        "not answer (network or server); re-run when it is reachable."
    )


def _probe_writable(raw: str, fs, out: str, local: bool) -> None:
    """Write and remove a probe file in the output; create missing folders for it and
    remove exactly those again (deepest first). Nothing the probe did not create is touched."""
    import os

    name = f".kpca-probe-{uuid.uuid4().hex}"
    created: list[str] = []
    try:
        if local:
            missing, p = [], os.path.abspath(out)
            while not os.path.exists(p):
                missing.append(p)
                parent = os.path.dirname(p)
                if parent == p:
                    break
                p = parent
            if not os.path.isdir(p):
                raise Stop(
                    f"cannot create output {raw}: {p} is a file, not a folder; choose "
                    "another output.path."
                )
            for d in reversed(missing):
                os.mkdir(d)
                created.append(d)
            target = os.path.join(out, name)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
            os.unlink(target)
        else:
            from pipeline.output import BUCKET_SCHEMES, missing_bucket_message

            scheme, bucket = raw.split("://", 1)[0].lower(), out.strip("/").split("/")[0]
            if scheme in BUCKET_SCHEMES and bucket and not fs.exists(bucket):
                raise Stop(
                    f"cannot write to output {raw}: {missing_bucket_message(scheme, bucket)}."
                )
            target = posixpath.join(out, name)
            fs.pipe_file(target, b"kpca write probe")
            fs.rm_file(target)
    except Stop:
        raise
    except OSError as exc:
        if getattr(exc, "errno", None) == 30:  # EROFS: the words of the run's own check
            raise Stop(
                f"cannot write {raw}: the file system is read-only; set output.path (or "
                "--output) to a writable folder."
            ) from None
        if not local and unreachable(exc) is Unreachable:
            raise _unanswered(raw, exc) from None
        why = "permission denied" if isinstance(exc, PermissionError) else short(exc)
        raise Stop(
            f"cannot write to output {raw} ({why}); set output.path (or --output) to a "
            "folder this user may write."
        ) from None
    except Exception as exc:  # noqa: BLE001 - object stores raise their own kinds
        if unreachable(exc) is Unreachable:
            raise _unanswered(raw, exc) from None
        raise Stop(
            f"cannot write to output {raw} ({type(exc).__name__}: {short(exc)}); check "
            "output.path, its permissions and the credentials in the environment."
        ) from None
    finally:
        for d in reversed(created):
            try:
                os.rmdir(d)
            except OSError:
                pass


# ------------------------------------------------------------------------ entry point
def validate(
    cfg: PipelineConfig, *, probe_output: bool = True, full: bool = True
) -> Validation:
    """Every pre-start check of ``cfg``; a :class:`Validation` listing what was found.

    Reads the input's header and first rows, then (``full``) every row in one streaming
    pass (pipeline/data/scan.py: row count, NaN/inf, text in numeric columns, missing labels,
    missing or repeated ids, each with its exact row and column), and probes the output
    for writing (leaving nothing behind); starts no cluster and imports no Prefect.
    """
    v = Validation(full=full)
    for name, check in (
        ("input", lambda: check_input(cfg, v)),
        ("output", lambda: _check_output(cfg, v, probe=probe_output)),
    ):
        try:
            check()
        except Stop as stop:
            v.findings.append(Finding(name, str(stop), transient=isinstance(stop, Unreachable)))
    check_evaluate(cfg, v)
    return v


def validate_input(inp: Any, *, full: bool = True) -> Validation:
    """The input checks alone (``inp``: an InputConfig), for a batch of ``kpca update``
    or the rows of ``kpca transform``: header, sample and (``full``) every row."""
    from types import SimpleNamespace

    v = Validation(full=full)
    try:
        check_input(SimpleNamespace(input=inp), v)
    except Stop as stop:
        v.findings.append(Finding("input", str(stop), transient=isinstance(stop, Unreachable)))
    return v
