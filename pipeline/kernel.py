"""Kernel stage: the block-partitioned kernel matrix materialised in zarr.

Only the upper blocks ``K_IJ`` (``I <= J``) are computed and stored, one zarr
chunk per block, in parallel on the Dask cluster. Each block task writes its
chunk and then a *done marker* (its own one-element chunk of the ``done``
array, holding the block's CRC-32), so concurrent tasks never write the same
object and a killed build leaves only whole blocks behind. A re-run of the same
build skips blocks whose marker is present -- after re-reading them and
checking the CRC when ``verify`` is on -- and computes the rest.

Whether to materialise at all is a cost question (``plan_materialize``):
reading a stored float32 block back costs about as much as evaluating a cheap
kernel on small-d data, so the default materialises only when the number of
features makes evaluation expensive (measured crossover:
``MATERIALIZE_MIN_FEATURES``; see benchmarks/bench_kernel_store.py).
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import asdict, dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np

from kpca_dask.gram import kernel_block
from kpca_dask.kernels import Kernel

from .progress import compute
from .store import Location

__all__ = ["MATERIALIZE_MIN_FEATURES", "plan_materialize", "KernelStoreResult",
           "build_kernel_store", "KernelBlockReader", "KernelStoreError"]

logger = logging.getLogger("pipeline")

#: Features above which reading a stored block back is cheaper than
#: re-evaluating an rbf-type kernel (benchmarks/bench_kernel_store.py).
MATERIALIZE_MIN_FEATURES = 512

_DONE = np.uint64(1 << 32)


class KernelStoreError(RuntimeError):
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
        return True, (f"{n_features} features >= {MATERIALIZE_MIN_FEATURES}: reading a stored "
                      "block is cheaper than re-evaluating it each pass")
    return False, (f"{n_features} features < {MATERIALIZE_MIN_FEATURES}: re-evaluating a block "
                   "is cheaper than reading it back")


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


def _crc(block: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(block).tobytes()) & 0xFFFFFFFF


class KernelBlockReader:
    """Picklable ``(i, j) -> K_ij`` reader of a kernel store (one per worker process)."""

    def __init__(self, url: str, storage_options: dict | None = None):
        self.url = url
        self.storage_options = storage_options or {}
        self._arrays = None

    def __getstate__(self):
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state):
        self.__init__(state["url"], state["storage_options"])

    def __dask_tokenize__(self):
        return ("KernelBlockReader", self.url)

    def _open(self):
        if self._arrays is None:
            g = Location(self.url, self.storage_options).open_group("r")
            self._arrays = (g["K"], g["done"], int(g.attrs["block_rows"]))
        return self._arrays

    def __call__(self, i: int, j: int) -> np.ndarray:
        K, done, r = self._open()
        marker = int(done[i, j])
        if not marker & int(_DONE):
            raise KernelStoreError(f"kernel block ({i}, {j}) of {self.url} was never written; "
                                   "re-run the kernel stage.")
        try:
            blk = np.asarray(K[i * r:(i + 1) * r, j * r:(j + 1) * r])
        except Exception as exc:
            raise KernelStoreError(f"kernel block ({i}, {j}) of {self.url} cannot be read "
                                   f"({exc}); re-run the kernel stage to rewrite it.") from exc
        if _crc(blk) != marker & 0xFFFFFFFF:
            raise KernelStoreError(f"kernel block ({i}, {j}) of {self.url} fails its checksum; "
                                   "re-run the kernel stage (it rewrites corrupt blocks).")
        return blk


def _ensure_block(url, storage_options, i, j, xi, xj, kernel, dtype, verify):
    """Compute and store block (i, j) unless a verified copy exists. Idempotent."""
    g = Location(url, storage_options).open_group("r+")
    K, done = g["K"], g["done"]
    r = int(g.attrs["block_rows"])
    marker = int(done[i, j])
    if marker & int(_DONE):
        if not verify:
            return "skipped", 0
        try:
            blk = np.asarray(K[i * r:(i + 1) * r, j * r:(j + 1) * r])
            if _crc(blk) == marker & 0xFFFFFFFF:
                return "skipped", 0
        except Exception:  # unreadable chunk: rewrite it below
            pass
        logger.warning("kernel store: block (%d, %d) failed verification; recomputing", i, j)
    blk = kernel_block(kernel, xi, xj if xj is not None else xi, dtype)
    K[i * r:(i + 1) * r, j * r:(j + 1) * r] = blk
    done[i, j] = _DONE | np.uint64(_crc(blk))
    return "computed", blk.nbytes


def build_kernel_store(X: da.Array, kernel: Kernel, dtype: Any, store: Location, *,
                       input_fingerprint: str, verify: bool = True) -> KernelStoreResult:
    """Materialise the upper blocks of ``k(X, X)`` (row blocks = ``X``'s chunks) in ``store``.

    ``X`` must have regular row chunks (all equal but the last). A store built
    for another input, kernel, dtype or chunking is refused for resuming and
    rebuilt from scratch.
    """
    from zarr.codecs import Crc32cCodec

    t0 = time.perf_counter()
    dtype = np.dtype(dtype)
    rows = X.chunks[0]
    r = int(rows[0])
    if any(c != r for c in rows[:-1]) or rows[-1] > r:
        raise ValueError(f"X needs regular row chunks for a kernel store, got {rows[:5]}...")
    n, nb = int(X.shape[0]), len(rows)
    identity = {"input_fingerprint": input_fingerprint, "kernel": kernel.to_dict(),
                "dtype": dtype.name, "block_rows": r, "n": n}
    fresh = True
    if store.exists():
        try:
            g = store.open_group("r")
            if all(g.attrs.get(k) == v for k, v in identity.items()) and "done" in g:
                fresh = False
        except Exception:
            fresh = True
        if fresh:
            logger.info("kernel store %s belongs to another input or kernel: rebuilding", store)
            store.remove()
    if fresh:
        g = store.open_group("w")
        g.create_array("K", shape=(n, n), chunks=(r, r), dtype=dtype,
                       compressors=[Crc32cCodec()], fill_value=0)
        g.create_array("done", shape=(nb, nb), chunks=(1, 1), dtype="uint64", fill_value=0)
        g.attrs.update({**identity, "layout": "upper blocks I <= J of K, one chunk each; "
                        "done[I, J] = 2**32 | crc32(block) once written"})
    xb = X.to_delayed()[:, 0]
    so = store.storage_options
    tasks = [dask.delayed(_ensure_block, pure=False)(store.url, so, i, j, xb[i],
                                                     None if i == j else xb[j], kernel,
                                                     dtype.name, verify)
             for i in range(nb) for j in range(i, nb)]
    logger.info("kernel store: %d upper blocks of %d rows (%s) -> %s", len(tasks), r,
                dtype.name, store)
    results = compute(*tasks, label="kernel blocks")
    computed = sum(1 for s, _ in results if s == "computed")
    skipped = len(results) - computed
    written = int(sum(b for _, b in results))
    res = KernelStoreResult(path=str(store), n=n, block_rows=r, n_blocks=len(tasks),
                            computed=computed, skipped=skipped, bytes_written=written,
                            dtype=dtype.name, kernel=kernel.to_dict(),
                            seconds=time.perf_counter() - t0)
    logger.info("kernel store: %d blocks computed, %d verified and kept, %.2f GB written in %.1f s",
                computed, skipped, written / 1e9, res.seconds)
    return res
