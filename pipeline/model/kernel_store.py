"""Kernel stage: the block-partitioned kernel matrix materialised in zarr.

Only the upper blocks ``K_IJ`` (``I <= J``) are computed and stored, one zarr
chunk per block, in parallel on the Dask cluster. Each block task writes its
chunk and then a *done marker* (its own one-element chunk of the ``done``
array, holding the block's CRC-32C), so concurrent tasks never write the same
object and a killed build leaves only whole blocks behind. A re-run of the same
build skips blocks whose marker is present -- after re-reading them and
checking the CRC when ``verify`` is on -- and computes the rest.

Whether to materialise at all is a cost question (``plan_materialize``):
reading a stored float32 block back costs about as much as evaluating a cheap
kernel on small-d data, so the default materialises only when the number of
features makes evaluation expensive (measured crossover:
``MATERIALIZE_MIN_FEATURES``; see benchmarks/bench_kernel_store.py). The layout, the
read path of a pass and the measurements: docs/kernel-store.md.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np

from kpca_dask.gram import kernel_block
from kpca_dask.kernels import Kernel
from pipeline.errors import UserError
from pipeline.output import Location
from pipeline.runtime import compute

__all__ = [
    "MATERIALIZE_MIN_FEATURES",
    "plan_materialize",
    "KernelStoreResult",
    "build_kernel_store",
    "KernelBlockReader",
    "KernelStoreError",
]

logger = logging.getLogger("pipeline")

#: Features above which reading a stored block back is cheaper than
#: re-evaluating an rbf-type kernel (benchmarks/bench_kernel_store.py).
MATERIALIZE_MIN_FEATURES = 512

_DONE = np.uint64(1 << 32)


class KernelStoreError(UserError, RuntimeError):
    """A stored kernel block is missing or corrupt."""


def plan_materialize(mode: str, solver: str, n_features: int) -> tuple[bool, str]:
    """Decide whether the exact path should materialise K, and say why."""
    if solver not in ("dense", "randomized"):
        return False, f"the {solver} solver never forms the kernel matrix"
    if mode == "always":
        return True, "kernel_store.materialize = always"
    if mode == "never":
        return False, "kernel_store.materialize = never"
    if n_features >= MATERIALIZE_MIN_FEATURES:
        return True, (
            f"{n_features} features >= {MATERIALIZE_MIN_FEATURES}: reading a stored "
            "block is cheaper than re-evaluating it each pass"
        )
    return False, (
        f"{n_features} features < {MATERIALIZE_MIN_FEATURES}: re-evaluating a block "
        "is cheaper than reading it back"
    )


@dataclass
class KernelStoreResult:
    path: str
    n: int
    block_rows: int
    n_blocks: int
    computed: int
    skipped: int
    bytes_written: int
    dtype: str
    kernel: dict
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: the done markers' checksum (recorded in the store's attributes: a store whose markers
#: use another one is rebuilt, not misread as corrupt)
MARKER_CHECKSUM = "crc32c"


def _crc(block: np.ndarray) -> int:
    """CRC-32C of the block's bytes, without copying them.

    google_crc32c (a zarr dependency, hardware-accelerated) is several times faster than
    zlib.crc32 on a ``tobytes()`` copy (docs/tuning.md).
    """
    import google_crc32c

    raw = np.ascontiguousarray(block).reshape(-1).view(np.uint8)
    if raw.flags.writeable:
        raw = raw.view()
        raw.flags.writeable = False  # the C extension takes read-only buffers only
    return int(google_crc32c.value(raw))


#: zarr handles opened by readers in this process, by (url, options, build id): a task
#: arrives with its own unpickled reader, and opening the group and its two arrays
#: (three metadata reads) costs a quarter of a stored block's pass (docs/tuning.md).
_OPENED: dict[tuple, _Handles] = {}
_OPENED_LOCK = threading.Lock()
_OPENED_MAX = 8


@dataclass
class _Handles:
    """One build of a kernel store, opened in this process."""

    K: Any
    done: Any
    r: int
    raw: bool  # whole blocks can be read as their chunk's bytes
    chunk_dir: str | None  # local folder of K's chunk files (memory-mapped), else None
    #: (i, j) -> ((inode, size, mtime) of the verified chunk file, its done marker)
    markers: dict = field(default_factory=dict)


def _handles(url: str, storage_options: dict, build_id: str, mode: str) -> _Handles:
    """Build ``build_id`` of the store at ``url``, opened once per process and mode."""
    key = (url, json.dumps(storage_options, sort_keys=True, default=str), build_id, mode)
    h = _OPENED.get(key)
    if h is None:
        g = Location(url, storage_options).open_group(mode)
        if str(g.attrs.get("build_id", "")) != build_id:
            raise KernelStoreError(
                f"the kernel store {url} was rebuilt after this stage started; re-run it."
            )
        K, r = g["K"], int(g.attrs["block_rows"])
        raw = _raw_layout(K, r)
        h = _Handles(K, g["done"], r, raw, _chunk_dir(K) if raw else None)
        with _OPENED_LOCK:
            while len(_OPENED) >= _OPENED_MAX:
                _OPENED.pop(next(iter(_OPENED)))
            _OPENED[key] = h
    return h


class KernelBlockReader:
    """Picklable ``(i, j) -> K_ij`` reader of a kernel store.

    Carries the store's ``build_id`` (read when the reader is made): a worker process
    opens each build once and reuses the handles for every block task, and a reader
    made before the store was rebuilt fails instead of reading the new blocks.
    Every block is checked against its done marker (CRC-32C) at every read.
    """

    def __init__(
        self, url: str, storage_options: dict | None = None, build_id: str | None = None
    ):
        self.url = url
        self.storage_options = storage_options or {}
        if build_id is None:
            try:
                attrs = Location(url, self.storage_options).open_group("r").attrs
            except Exception as exc:
                raise KernelStoreError(
                    f"no kernel store at {url} ({exc}); run the kernel stage first."
                ) from exc
            build_id = str(attrs.get("build_id", ""))
        self.build_id = build_id

    def __getstate__(self):
        return {
            "url": self.url,
            "storage_options": self.storage_options,
            "build_id": self.build_id,
        }

    def __setstate__(self, state):
        self.__init__(state["url"], state["storage_options"], state["build_id"])

    def __dask_tokenize__(self):
        return ("KernelBlockReader", self.url, self.build_id)

    def _open(self) -> _Handles:
        return _handles(self.url, self.storage_options, self.build_id, "r")

    def __call__(self, i: int, j: int) -> np.ndarray:
        h = self._open()
        try:
            blk, sig = _read_block(h, i, j)
            cached = h.markers.get((i, j)) if sig is not None else None
            marker = cached[1] if cached is not None and cached[0] == sig else int(h.done[i, j])
        except Exception as exc:
            raise KernelStoreError(
                f"kernel block ({i}, {j}) of {self.url} cannot be read "
                f"({exc}); re-run the kernel stage to rewrite it."
            ) from exc
        if not marker & int(_DONE):
            raise KernelStoreError(
                f"kernel block ({i}, {j}) of {self.url} was never written; "
                "re-run the kernel stage."
            )
        if not _matches(blk, marker):
            raise KernelStoreError(
                f"kernel block ({i}, {j}) of {self.url} fails its checksum; "
                "re-run the kernel stage (it rewrites corrupt blocks)."
            )
        if sig is not None:
            # A marker read through zarr is not free (docs/tuning.md). It is kept, once
            # its block checks out, for as long as the chunk file is the same file: a
            # build writes a block's chunk (a new file) before its marker.
            h.markers[(i, j)] = (sig, marker)
        return blk


def _matches(blk: np.ndarray | None, marker: int) -> bool:
    """Whether a block was read and its CRC-32C is the one its done marker records."""
    return blk is not None and _crc(blk) == marker & 0xFFFFFFFF


def _verified_block(h: _Handles, i: int, j: int, marker: int) -> np.ndarray | None:
    """Block ``(i, j)`` if it is there and matches its done marker, else None."""
    blk, _ = _read_block(h, i, j)
    return blk if _matches(blk, marker) else None


def _whole(h: _Handles, i: int, j: int) -> bool:
    """Whether block ``(i, j)`` fills its chunk (every block but the last row/column's)."""
    return (i + 1) * h.r <= h.K.shape[0] and (j + 1) * h.r <= h.K.shape[1]


def _chunk_path(h: _Handles, i: int, j: int) -> str:
    """The local file of block ``(i, j)``'s chunk (``h.chunk_dir`` must be set)."""
    return os.path.join(h.chunk_dir, *h.K.metadata.encode_chunk_key((i, j)).split("/"))


def _read_block(h: _Handles, i: int, j: int) -> tuple[np.ndarray | None, tuple | None]:
    """Block ``(i, j)`` of the store's ``K`` without a copy, and its chunk file's identity.

    A whole block is exactly one chunk whose bytes are the block (little-endian, C order)
    followed by their CRC-32C (the bytes + crc32c codecs the build writes), so it is read
    raw and viewed in place; zarr's own decode checked the same CRC and then copied the
    16 MB into a new array, three times slower (docs/tuning.md). A local chunk file is
    memory-mapped (the page cache's pages, no copy at all), other stores' chunks are read
    whole. The
    caller checks the block against its done marker, which is the same CRC-32C: one
    checksum instead of two. Edge blocks (smaller than a chunk) and any other layout go
    through zarr. ``None``: the chunk is missing or has the wrong size.

    zarr replaces a chunk file atomically (a new file renamed over the old one), so a
    block being rewritten never changes under a mapping; truncating a chunk file in
    place while a task maps it would kill that worker (SIGBUS).
    """
    K, r = h.K, h.r
    if not (h.raw and _whole(h, i, j)):
        return np.asarray(K[i * r : (i + 1) * r, j * r : (j + 1) * r]), None
    dtype = np.dtype(K.dtype).newbyteorder("<")
    size = r * r * dtype.itemsize + 4
    if h.chunk_dir is not None:
        try:
            fd = os.open(_chunk_path(h, i, j), os.O_RDONLY)
        except FileNotFoundError:
            return None, None
        try:
            st = os.fstat(fd)
            if st.st_size != size:
                return None, None
            data = mmap.mmap(
                fd, size, flags=mmap.MAP_SHARED | _MAP_POPULATE, prot=mmap.PROT_READ
            )
        finally:
            os.close(fd)
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        return np.frombuffer(data, dtype=dtype, count=r * r).reshape(r, r), sig
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    key = K.metadata.encode_chunk_key((i, j))
    buf = sync((K.store_path / key).get(prototype=default_buffer_prototype()))
    if buf is None:
        return None, None
    data = buf.as_numpy_array().view(np.uint8)
    if data.nbytes != size:
        return None, None
    return data[:-4].view(dtype).reshape(r, r), None


#: pre-fault a mapped chunk in one call (Linux); 0 elsewhere
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _chunk_dir(K) -> str | None:
    """The local folder holding ``K``'s chunk files, or None for other stores."""
    from zarr.storage import LocalStore

    store = K.store_path.store
    if not isinstance(store, LocalStore):
        return None
    return os.path.join(str(store.root), *[p for p in K.store_path.path.split("/") if p])


def _raw_layout(K, r: int) -> bool:
    """Whether ``K``'s chunks are (r, r) blocks stored as plain bytes + CRC-32C."""
    from zarr.codecs import BytesCodec, Crc32cCodec

    codecs = tuple(K.metadata.codecs)
    return (
        K.chunks == (r, r)
        and len(codecs) == 2
        and isinstance(codecs[0], BytesCodec)
        and str(getattr(codecs[0].endian, "value", codecs[0].endian)) in ("little", "None")
        and isinstance(codecs[1], Crc32cCodec)
    )


def _ensure_block(url, storage_options, build_id, i, j, xi, xj, kernel, dtype, verify):
    """Compute and store block (i, j) unless a verified copy exists. Idempotent."""
    h = _handles(url, storage_options, build_id, "r+")
    K, done, r = h.K, h.done, h.r
    marker = int(done[i, j])
    if marker & int(_DONE):
        if not verify:
            return "skipped", 0
        try:
            if _verified_block(h, i, j, marker) is not None:
                return "skipped", 0
        except Exception:  # unreadable chunk: rewrite it below
            pass
        logger.warning("kernel store: block (%d, %d) failed verification; recomputing", i, j)
    blk = kernel_block(kernel, xi, xj if xj is not None else xi, dtype)
    crc = _crc(blk)
    if not _write_raw(h, i, j, blk, crc):
        K[i * r : (i + 1) * r, j * r : (j + 1) * r] = blk
    done[i, j] = _DONE | np.uint64(crc)
    return "computed", blk.nbytes


def _write_raw(h: _Handles, i: int, j: int, blk: np.ndarray, crc: int) -> bool:
    """Write a whole block's chunk file directly, as zarr would; False: not possible here.

    The chunk is the block's bytes followed by their CRC-32C (the bytes + crc32c codecs),
    and that CRC is the done marker, already computed: zarr's own write encoded the
    block into a new buffer, checksummed it again and appended (slower: docs/tuning.md).
    Written like zarr's local store does, to a temporary file
    renamed over the chunk, so a reader never sees half a chunk and a mapped chunk is
    never truncated. zarr reads these chunks back (and checks their CRC) as its own.
    """
    if h.chunk_dir is None or not _whole(h, i, j):
        return False
    data = np.ascontiguousarray(blk, dtype=np.dtype(h.K.dtype).newbyteorder("<"))
    path = _chunk_path(h, i, j)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.partial"
    try:
        with open(tmp, "wb") as f:
            f.write(data.reshape(-1).view(np.uint8).data)
            f.write(np.array([crc], dtype="<u4").tobytes())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def build_kernel_store(
    X: da.Array,
    kernel: Kernel,
    dtype: Any,
    store: Location,
    *,
    input_fingerprint: str,
    verify: bool = True,
) -> KernelStoreResult:
    """Materialise the upper blocks of ``k(X, X)`` (row blocks = ``X``'s chunks) in ``store``.

    ``X`` must have regular row chunks (all equal but the last). A store built
    for another input, kernel, dtype or chunking is refused for resuming and
    rebuilt from scratch.
    """
    t0 = time.perf_counter()
    dtype = np.dtype(dtype)
    rows = X.chunks[0]
    r = int(rows[0])
    if any(c != r for c in rows[:-1]) or rows[-1] > r:
        raise ValueError(f"X needs regular row chunks for a kernel store, got {rows[:5]}...")
    n, nb = int(X.shape[0]), len(rows)
    identity = {
        "input_fingerprint": input_fingerprint,
        "kernel": kernel.to_dict(),
        "dtype": dtype.name,
        "block_rows": r,
        "n": n,
        "marker": MARKER_CHECKSUM,
    }
    build_id = _resumable_build(store, identity)
    if build_id is None:
        build_id = _create_store(store, identity, n, nb, r, dtype)
    tasks = _block_tasks(X, kernel, dtype, store, build_id, verify)
    logger.info(
        "kernel store: %d upper blocks of %d rows (%s) -> %s", len(tasks), r, dtype.name, store
    )
    results = compute(*tasks, label="kernel blocks")
    computed = sum(1 for s, _ in results if s == "computed")
    skipped = len(results) - computed
    written = int(sum(b for _, b in results))
    res = KernelStoreResult(
        path=str(store),
        n=n,
        block_rows=r,
        n_blocks=len(tasks),
        computed=computed,
        skipped=skipped,
        bytes_written=written,
        dtype=dtype.name,
        kernel=kernel.to_dict(),
        seconds=time.perf_counter() - t0,
    )
    logger.info(
        "kernel store: %d blocks computed, %d verified and kept, %.2f GB written in %.1f s",
        computed,
        skipped,
        written / 1e9,
        res.seconds,
    )
    return res


def _resumable_build(store: Location, identity: dict[str, Any]) -> str | None:
    """The build id of a store built for this ``identity`` (input, kernel, dtype, chunking)
    to resume; None when there is none (a store built for another is removed, logged)."""
    if not store.exists():
        return None
    try:
        g = store.open_group("r")
        if all(g.attrs.get(k) == v for k, v in identity.items()) and "done" in g:
            return str(g.attrs["build_id"])
    except Exception:
        pass
    logger.info("kernel store %s belongs to another input or kernel: rebuilding", store)
    store.remove()
    return None


def _create_store(
    store: Location, identity: dict[str, Any], n: int, nb: int, r: int, dtype: np.dtype
) -> str:
    """A new, empty store: ``K`` (n x n, r x r chunks) and its ``done`` markers; the new
    build id."""
    from zarr.codecs import Crc32cCodec

    g = store.open_group("w")
    g.create_array(
        "K", shape=(n, n), chunks=(r, r), dtype=dtype, compressors=[Crc32cCodec()], fill_value=0
    )
    g.create_array("done", shape=(nb, nb), chunks=(1, 1), dtype="uint64", fill_value=0)
    build_id = uuid.uuid4().hex
    g.attrs.update(
        {
            **identity,
            "build_id": build_id,
            "kind": "kpca-dask-kernel-store",
            "layout": "upper blocks I <= J of K, one chunk each; "
            "done[I, J] = 2**32 | crc32c(block) once written",
        }
    )
    return build_id


def _block_tasks(
    X: da.Array, kernel: Kernel, dtype: np.dtype, store: Location, build_id: str, verify: bool
) -> list[Any]:
    """One delayed :func:`_ensure_block` per upper block ``I <= J`` of ``k(X, X)``."""
    xb = X.to_delayed()[:, 0]
    ensure = dask.delayed(_ensure_block, pure=False)
    head = (store.url, store.storage_options, build_id)
    return [
        ensure(*head, i, j, xb[i], None if i == j else xb[j], kernel, dtype.name, verify)
        for i in range(len(xb))
        for j in range(i, len(xb))
    ]
