"""Verified reads of stored zarr arrays: no missing chunk read as zeros, no damaged chunk
read as a traceback, no edited attribute taken as it is.

zarr reads an absent chunk as the array's fill value without a word, and a truncated or
garbled chunk raises the codec's own error (``Zstd decompression error``) that names no
object. Every read of data the pipeline relies on (a published run, an ingest store, a
base run's rows in an update's lineage) goes through this module instead:

* :func:`check_present` lists the array's chunk objects (one listing, no chunk read) and
  refuses, naming the first (``<array>/c/2/0``), any chunk that is absent and not recorded
  as absent when the array was written (zarr skips chunks equal to the fill value unless
  ``write_empty_chunks`` is set; the manifest records those, :func:`absent_chunks`);
* :func:`checked_array` is a dask array whose tasks read one chunk each and turn a decoding
  error into :class:`~pipeline.errors.CorruptObjectError` naming the chunk, a failure of
  the store into :class:`~pipeline.errors.StoreError` naming it and the operation, and
  (given the digests recorded when it was written) a chunk whose values changed into a
  CorruptObjectError naming the chunk;
* :func:`attrs_digest` is the SHA-256 of an array's or group's attributes (canonical
  JSON), which the manifest records per array (``integrity.attrs``), so that an edited
  ``classes`` or ``columns`` fails verification like an edited value.

The functions take zarr arrays/groups or a :class:`~pipeline.output.store.Location` (whatever
prefix a run is published under); they know no run layout.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import dask.array as da

from pipeline.errors import USER_OS_ERRORS, CorruptObjectError, PipelineError, StoreError

__all__ = [
    "INTEGRITY_VERSION",
    "absent_chunks",
    "attrs_digest",
    "check_present",
    "checked_array",
    "chunk_digest",
    "describe_store_failure",
    "endpoint_hint",
    "is_store_failure",
    "object_name",
    "open_checked_group",
    "read_chunk",
    "store_error",
]

#: version of the manifest's ``integrity`` record (attribute digests, absent chunks);
#: manifests without the record (written before it) verify as they did: values only
INTEGRITY_VERSION = 1

#: modules whose exceptions mean the store (or the network to it) failed, not the bytes
_STORE_MODULES = (
    "botocore",
    "aiobotocore",
    "aiohttp",
    "s3fs",
    "gcsfs",
    "google",
    "adlfs",
    "azure",
    "requests",
    "urllib3",
    "fsspec",
)


def is_store_failure(exc: BaseException) -> bool:
    """The store or the way to it failed (an OS/network error, an SDK's error), as opposed
    to bytes that were read but cannot be decoded."""
    if isinstance(exc, PipelineError):
        return isinstance(exc, StoreError)
    if isinstance(exc, OSError):  # ConnectionError, TimeoutError, PermissionError...
        return True
    return any(e.__module__.split(".")[0] in _STORE_MODULES for e in type(exc).__mro__[:-2])


def _short(exc: BaseException, limit: int = 200) -> str:
    msg = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {msg[:limit]}" if msg else type(exc).__name__


def store_error(operation: str, what: str, exc: BaseException) -> StoreError:
    """A :class:`StoreError` naming the operation (read, write, list, delete) and the
    object; the store's own message kept short."""
    if isinstance(exc, StoreError):
        return exc
    perm = isinstance(exc, PermissionError) or "AccessDenied" in str(exc)
    hint = (
        "the credentials in use may not (any longer) be allowed to"
        if perm
        else "the store failed (its client retried with backoff first)"
    )
    return StoreError(f"cannot {operation} {what}: {hint} ({_short(exc)})")


def object_name(z: Any, key: str | None = None) -> str:
    """``<store url>/<array path>[/<chunk key>]`` of a zarr array (or group)."""
    store, path = z.store_path.store, z.store_path.path.strip("/")
    if hasattr(store, "fs") and isinstance(getattr(store, "path", None), str):  # fsspec
        proto = store.fs.protocol
        proto = proto[0] if isinstance(proto, (tuple, list)) else proto
        root = f"{proto}://{store.path.strip('/')}"
    else:
        root = str(getattr(store, "root", "") or store).removeprefix("file://")
    base = f"{root.rstrip('/')}/{path}" if path else root.rstrip("/")
    return f"{base}/{key}" if key else base


def _canonical(obj: Any) -> str:
    return json.dumps(
        obj,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=True,
        default=str,
    )


def attrs_digest(node: Any) -> str:
    """SHA-256 of a zarr array's or group's attributes, as canonical JSON."""
    return "sha256:" + hashlib.sha256(_canonical(dict(node.attrs)).encode()).hexdigest()


def _chunk_key(z: Any, idx: tuple[int, ...]) -> str:
    """The key of the stored object holding block ``idx`` of ``z.chunks`` (its shard when
    sharded)."""
    shards = getattr(z, "shards", None)
    if shards:
        idx = tuple(i * c // s for i, c, s in zip(idx, z.chunks, shards))
    return z.metadata.encode_chunk_key(idx)


def absent_chunks(z: Any) -> list[str]:
    """Keys of the chunk objects of ``z`` that its store does not hold (listed, not read)."""
    from kpca_dask.validation import missing_zarr_chunks

    try:
        missing = missing_zarr_chunks(z)
    except Exception as exc:
        if is_store_failure(exc):
            raise store_error("list", object_name(z), exc) from exc
        raise
    return [z.metadata.encode_chunk_key(i) for i in missing]


def check_present(z: Any, *, allowed: Any = (), fix: str = "") -> None:
    """Refuse (CorruptObjectError naming the first) chunks of ``z`` absent from its store
    other than the ``allowed`` keys (chunks equal to the fill value, never written)."""
    from kpca_dask.validation import describe_missing_chunks, missing_zarr_chunks

    allowed = set(allowed or ())
    try:
        missing = [
            i for i in missing_zarr_chunks(z) if z.metadata.encode_chunk_key(i) not in allowed
        ]
    except Exception as exc:
        if is_store_failure(exc):
            raise store_error("list", object_name(z), exc) from exc
        raise
    if missing:
        key = z.metadata.encode_chunk_key(missing[0])
        rows = describe_missing_chunks(z, missing).rpartition(", ")[2].rstrip(")")
        more = f" (and {len(missing) - 1} more chunks)" if len(missing) > 1 else ""
        raise CorruptObjectError(
            f"chunk {object_name(z, key)} ({rows}) is missing{more}: zarr would read it as "
            f"zeros{'; ' + fix if fix else ''}"
        )


def read_chunk(z: Any, idx: tuple[int, ...], *, fix: str = "") -> np.ndarray:
    """Block ``idx`` of ``z`` (``z.chunks`` grid): a StoreError when the store fails, a
    CorruptObjectError naming the chunk when its bytes cannot be decoded."""
    key = _chunk_key(z, idx) if z.ndim else "c"
    try:
        return np.asarray(z.get_block_selection(idx) if z.ndim else z[...])
    except PipelineError:
        raise
    except Exception as exc:
        if is_store_failure(exc):
            raise store_error("read", object_name(z, key), exc) from exc
        raise CorruptObjectError(
            f"chunk {object_name(z, key)} cannot be decoded ({_short(exc, 120)}): the chunk is "
            f"truncated or damaged{'; ' + fix if fix else ''}"
        ) from exc


def chunk_digest(x: np.ndarray) -> np.ndarray:
    """The 16-byte BLAKE2b of one chunk's values (strings joined by US), shaped
    ``(1,) * ndim + (16,)`` (what ``pipeline.output.store._digest_blocks`` maps over chunks)."""
    x = np.ascontiguousarray(x)
    if x.dtype.kind in "OUT":
        data = "\x1f".join(map(str, x.ravel())).encode()
    else:
        data = x.astype(x.dtype.newbyteorder("<"), copy=False).tobytes()
    h = hashlib.blake2b(data, digest_size=16).digest()
    return np.frombuffer(h, dtype=np.uint8).reshape((1,) * x.ndim + (16,))


#: in the keys of checked reads: the same within a process (a graph read twice shares its
#: tasks), never across processes, so a shared cluster never answers a new command with
#: a result or error of an earlier one's read of the same chunks (restored since)
_SESSION = uuid.uuid4().hex


def _read_checked(z: Any, idx: tuple[int, ...], expected: bytes | None, fix: str, what: str):
    """One task of :func:`checked_array`: block ``idx`` read and checked."""
    x = read_chunk(z, idx, fix=fix)
    if expected is not None and chunk_digest(x).tobytes() != expected:
        raise CorruptObjectError(
            f"chunk {object_name(z, _chunk_key(z, idx))} differs from the digest recorded "
            f"{what or 'when it was written'}: its values changed{'; ' + fix if fix else ''}"
        )
    return x


def checked_array(
    z: Any, *, digests: np.ndarray | None = None, fix: str = "", what: str = ""
) -> da.Array:
    """``z`` as a dask array (chunked like ``da.from_zarr(z)``) whose every chunk read is
    checked (:func:`read_chunk`); with ``digests`` (one 16-byte BLAKE2b per chunk, the
    layout of :func:`pipeline.output.store._digest_blocks`, recorded when ``z`` was written) a
    chunk whose values differ is refused, naming it and ``what`` recorded them. One task
    per chunk, each carrying only its own digest."""
    import dask.array as da  # here: the CLI's error reporting imports this module
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    d = da.from_zarr(z)  # only for its chunking (no task of it is computed)
    if digests is not None:
        digests = np.asarray(digests, dtype=np.uint8).reshape(d.numblocks + (16,))
    token = tokenize(
        _SESSION, object_name(z), d.shape, d.chunks, str(d.dtype), digests, fix, what
    )
    name = "checked-" + token
    # ``z`` in every task, not one key of its own that the tasks depend on: dask's graph
    # optimisation fuses such a key into its only dependent and renames the result
    # ("checked-zarr-checked-..."), so a culled read of one chunk (check_finite's first
    # row) and a whole read defined the same chunk's key differently; two such graphs on
    # one cluster (an exact product's waves) lost a worker and failed with a KeyError
    # for the renamed key. A zarr array is a store reference and its metadata (a few KB).
    dsk: dict[Any, Any] = {}
    for idx in np.ndindex(*d.numblocks):
        expected = None if digests is None else digests[idx].tobytes()
        dsk[(name, *idx)] = (_read_checked, z, idx, expected, fix, what)
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    return da.Array(
        graph, name, chunks=d.chunks, dtype=d.dtype, meta=np.empty((0,) * d.ndim, d.dtype)
    )


def open_checked_group(loc: Any, *, fix: str = "") -> Any:
    """``loc.open_group("r")``: a StoreError naming the location when the store fails,
    a CorruptObjectError naming its ``zarr.json`` when that cannot be parsed."""
    try:
        return loc.open_group("r")
    except PipelineError:
        raise
    except FileNotFoundError:
        raise
    except Exception as exc:
        if is_store_failure(exc):
            raise store_error("read", f"{loc}/zarr.json", exc) from exc
        if isinstance(exc, ValueError | TypeError | KeyError):
            raise CorruptObjectError(
                f"{loc}/zarr.json cannot be read as zarr metadata ({_short(exc, 120)})"
                f"{'; ' + fix if fix else ''}"
            ) from exc
        raise


#: frames of the storage stack whose name says which operation failed (innermost wins)
_OPERATIONS = {
    "set": "write",
    "set_if_not_exists": "write",
    "_pipe_file": "write",
    "_put_file": "write",
    "_upload_chunk": "write",
    "_initiate_upload": "write",
    "commit": "write",
    "_call_s3": None,  # the S3 call itself: its operation name is in its locals
    "get": "read",
    "_cat_file": "read",
    "_fetch_range": "read",
    "_get_file": "read",
    "_info": "read",
    "_exists": "read",
    "exists": "read",
    "delete": "delete",
    "delete_dir": "delete",
    "_rm": "delete",
    "_rm_file": "delete",
    "rmdir": "delete",
    "unlink": "delete",
    "list": "list",
    "list_prefix": "list",
    "list_dir": "list",
    "_ls": "list",
    "_find": "list",
    "_lsdir": "list",
    "mkdir": "write",
    "makedirs": "write",
    "_mkdir": "write",
}
#: modules whose frames are the storage stack (a ``get`` elsewhere is not a store read)
_STORAGE_CODE = (
    "zarr.storage",
    "zarr.abc.store",
    "fsspec",
    "s3fs",
    "gcsfs",
    "adlfs",
    "pipeline.output.store",
    "kpca_dask.removal",
)
_S3_CALLS = {"put": "write", "get": "read", "head": "read", "delete": "delete", "list": "list"}


def _failed_operation(exc: BaseException) -> tuple[str | None, str | None]:
    """(operation, object) of the innermost storage frame of ``exc``'s traceback (None
    where it cannot be told: a traceback rebuilt from another process has no locals)."""
    op = obj = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        if code.co_name in _OPERATIONS and module.startswith(_STORAGE_CODE):
            loc = tb.tb_frame.f_locals
            what = _OPERATIONS[code.co_name]
            if what is None:  # s3fs: _call_s3(method, ...) with method "put_object"...
                name = getattr(loc.get("method"), "__name__", str(loc.get("method", "")))
                what = next((v for k, v in _S3_CALLS.items() if k in name.lower()), None)
                kw = loc.get("kwargs") or loc.get("kwarglist") or {}
                if isinstance(kw, dict) and kw.get("Bucket"):
                    key = kw.get("Key", kw.get("Prefix", ""))
                    obj = f"s3://{kw['Bucket']}/{key}".rstrip("/")
            else:
                for k in ("key", "path", "rpath", "lpath", "prefix"):
                    v = loc.get(k)
                    if isinstance(v, str) and v:
                        obj = v
                        break
            op = what or op
        tb = tb.tb_next
    return op, obj


def describe_store_failure(exc: BaseException, where: str = "") -> str | None:
    """One line for a failure of the store (None: ``exc`` is not one): the location, the
    operation and the object where they can be told, and what to do."""
    if isinstance(exc, StoreError):
        return str(exc)
    if isinstance(exc, PipelineError) or not is_store_failure(exc):
        return None
    if isinstance(exc, USER_OS_ERRORS) and not isinstance(exc, PermissionError):
        return None  # a wrong path: the user's to fix (pipeline/errors.py)
    op, obj = _failed_operation(exc)
    filename = getattr(exc, "filename", None)
    sdk = any(e.__module__.split(".")[0] in _STORE_MODULES for e in type(exc).__mro__[:-2])
    if not (op or filename or sdk):  # an OSError of the cluster's comms, not of a store
        return None
    obj = str(filename) if filename else obj
    perm = isinstance(exc, PermissionError) or "AccessDenied" in str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror
    else:
        reason = _short(exc)
    target = obj or where or "the store"
    if where and obj and where not in obj and not obj.startswith(where.split("://")[-1]):
        target = f"{obj} (in {where})"
    action = f"{op} " if op else "use "
    if perm:
        return (
            f"cannot {action}{target}: permission denied ({reason}); the credentials or file "
            "permissions in use do not (any longer) allow it: restore them, then re-run the "
            "same command."
        )
    return (
        f"cannot {action}{target}: the store failed ({reason}) after the client's "
        f"retries{endpoint_hint(exc)}; re-run the same command when it is reachable."
    )


#: what botocore says when no connection to the endpoint could be made at all (not when
#: one was made and then failed: "... closed before we received a valid response from
#: endpoint URL", "Read timeout on endpoint URL")
_NOT_CONNECTED = ("could not connect to the endpoint", "connect timeout on endpoint")


def endpoint_hint(exc: BaseException) -> str:
    """Where an object store's endpoint goes, for a failure to connect to one at all
    (a missing or wrong endpoint, as a rule); "" for any other failure."""
    msg = " ".join(str(exc).lower().split())
    if not any(s in msg for s in _NOT_CONNECTED):
        return ""
    return (
        "; an object store's endpoint goes in storage_options (or --storage-options): "
        '{"client_kwargs": {"endpoint_url": ...}}'
    )
