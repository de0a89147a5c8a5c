"""NPY input: a local file read through a memmap per chunk, a remote one in byte ranges
of its rows; only paths, URLs and layouts travel with the tasks, never the data."""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from pipeline.output import Location

from .base import InputError, SourceData, check_matrix_dtype, rows_per_chunk

__all__ = ["NpyFile", "RemoteNpyFile", "read_npy"]


def read_npy(cfg, loc, chunks) -> SourceData:
    if cfg.columns or cfg.label_column or cfg.id_column or cfg.exclude_columns:
        raise InputError(
            "NPY input has no named columns: remove input.columns/label_column/"
            "id_column/exclude_columns, or convert the data to Parquet/CSV."
        )
    try:
        if loc.is_local:
            arr = np.load(loc.local_path, mmap_mode="r", allow_pickle=False)
        else:  # only the header here: the workers read their rows in byte ranges
            arr = RemoteNpyFile.open(loc)
    except ValueError as exc:  # numpy's header errors, and the InputError of open()
        if "allow_pickle" in str(exc) or "Python objects" in str(exc):
            raise InputError(
                f"{cfg.path}: object arrays are refused (loading them would "
                "unpickle data); save numeric data."
            ) from exc
        raise InputError(f"{cfg.path} is not a readable NPY file: {exc}") from exc
    except (OSError, EOFError) as exc:
        raise InputError(f"{cfg.path} is not a readable NPY file: {exc}") from exc
    if not isinstance(arr, np.ndarray | RemoteNpyFile):  # np.load opens NPZ archives too
        names = list(getattr(arr, "files", []))[:10]
        if hasattr(arr, "close"):
            arr.close()
        raise InputError(
            f"{cfg.path} is an NPZ archive (arrays {names}), not an NPY file; "
            "save the feature matrix with numpy.save and point input.path at "
            "it."
        )
    check_matrix_dtype(arr.dtype, cfg.path)
    if arr.ndim != 2:
        raise InputError(
            f"{cfg.path} holds an array of shape {arr.shape}; need 2-D (n_samples, n_features)."
        )
    rows = rows_per_chunk(arr.shape[1], chunks.target_chunk_mb)
    # A local file is read by the workers, chunk by chunk, through its own memmap: handing
    # the memmap itself to dask would pickle the whole array into the graph (every byte
    # through the scheduler, and a worker killed for memory when the file is large).
    source = NpyFile.of(str(loc.local_path), arr) if loc.is_local else arr
    # (a remote file is a RemoteNpyFile already: its url and storage options travel)
    X = da.from_array(
        source,
        chunks=(rows, -1),
        name=f"npy-{loc.url}-{arr.shape}",
        asarray=False,
        inline_array=True,
    )
    return SourceData(X=X.astype(np.float64), columns=[f"x{i}" for i in range(arr.shape[1])])


class NpyFile:
    """A local NPY file as an array-like that dask can slice: each read maps the file
    read-only (no pickle), so only the path and the layout travel with the tasks.

    The header is parsed once, on the client (:meth:`of`). A read compares the file's
    header bytes with those and maps the data at the known offset: it never parses the
    header again. (``np.load`` in every task parsed it with ``ast.literal_eval``, which
    CPython 3.11 can fail with ``SystemError: AST constructor recursion depth mismatch``
    when threads parse at once, as the threaded scheduler's do: python/cpython#106905.)
    """

    def __init__(
        self,
        path: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        offset: int,
        fortran_order: bool,
        header: bytes,
    ):
        self.path, self.shape, self.dtype = path, tuple(shape), np.dtype(dtype)
        self.offset, self.fortran_order, self.header = int(offset), bool(fortran_order), header
        self.ndim = len(self.shape)

    @classmethod
    def of(cls, path: str, arr: np.memmap) -> NpyFile:
        """The file ``np.load(path, mmap_mode="r")`` opened as ``arr``: its layout and the
        header bytes before the data."""
        offset = int(arr.offset)
        with open(path, "rb") as f:
            header = f.read(offset)
        return cls(path, arr.shape, arr.dtype, offset, bool(np.isfortran(arr)), header)

    def __getitem__(self, key) -> np.ndarray:
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        with open(self.path, "rb") as f:
            header = f.read(self.offset)
            f.seek(0, 2)
            size = f.tell()
        if header != self.header or size != self.offset + nbytes:
            raise InputError(
                f"{self.path} changed while it was being read (its header or size is not "
                "the one read when the run started); re-run when the file is complete."
            )
        arr = np.memmap(
            self.path,
            dtype=self.dtype,
            mode="r",
            offset=self.offset,
            shape=self.shape,
            order="F" if self.fortran_order else "C",
        )
        return np.array(arr[key])

    def __dask_tokenize__(self):
        return ("NpyFile", self.path, self.shape, self.dtype.str, self.offset, self.header)


class RemoteNpyFile:
    """An NPY file at a URL (any fsspec filesystem) as an array-like that dask can slice.

    Made from the file's header alone (:meth:`open`, on the client); each read fetches
    only the byte range of its rows (C order: one range; Fortran order: one range per
    column), on whichever worker runs it, through the location's own storage options.
    Only the URL, the options and the layout travel with the tasks, never the data.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict,
        shape: tuple[int, ...],
        dtype: np.dtype,
        offset: int,
        fortran_order: bool,
    ):
        self.url, self.storage_options = url, dict(storage_options)
        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        self.offset, self.fortran_order = int(offset), bool(fortran_order)
        self.ndim = len(self.shape)

    @classmethod
    def open(cls, loc: Location) -> RemoteNpyFile:
        """Read and check the header of the NPY file at ``loc``: InputError (a ValueError,
        like numpy's own header errors) or OSError when it is not one; :func:`read_npy`
        words them for the user."""
        fmt = np.lib.format
        fs, path = loc.fs, loc.fs_path
        # the header only: a small read-ahead (an object store's default block is 5 MB or
        # more: 0.28 s of the ingest's 2.7 s at 1M rows on the S3 server, for ~128 bytes)
        with fs.open(path, "rb", block_size=1 << 16) as f:
            head = f.read(6)
            if head.startswith(b"PK"):  # a zip: np.load would open it as an NPZ archive
                raise InputError(
                    "it is an NPZ archive (a zip of arrays), not an NPY file; save the "
                    "feature matrix with numpy.save"
                )
            f.seek(0)
            major, minor = fmt.read_magic(f)
            if (major, minor) == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(f)
            elif (major, minor) == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(f)
            else:
                raise InputError(f"NPY format version {major}.{minor} is not supported")
            offset = f.tell()
        if dtype.hasobject:
            raise InputError("Object arrays cannot be loaded when allow_pickle=False")
        size = fs.size(path)
        expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if size != expected:
            raise InputError(
                f"the file holds {size} bytes where its header promises {expected} "
                "(truncated or still being written)"
            )
        return cls(loc.url, loc.storage_options, shape, dtype, offset, fortran)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_fs"}

    def _fs_path(self):
        fs = self.__dict__.get("_fs")
        if fs is None:
            import fsspec

            fs, path = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self._fs = fs, path
        return self._fs

    def _rows(self, start: int, stop: int, cols: slice) -> np.ndarray:
        """Rows ``start:stop`` (all columns in C order; ``cols`` in Fortran order)."""
        fs, path = self._fs_path()
        item = self.dtype.itemsize
        n = self.shape[0]
        d = int(np.prod(self.shape[1:], dtype=np.int64)) if self.ndim > 1 else 1
        if start >= stop:
            return np.empty((0, *self.shape[1:]), dtype=self.dtype)
        if not self.fortran_order or self.ndim == 1:
            a = self.offset + start * d * item
            b = self.offset + stop * d * item
            data = fs.cat_file(path, start=a, end=b)
            self._check(len(data), b - a)
            rows = np.frombuffer(data, dtype=self.dtype)
            return rows.reshape((stop - start, *self.shape[1:]))
        # Fortran order (2-D only here): each column's rows are one range
        js = range(*cols.indices(self.shape[1]))
        starts = [self.offset + (j * n + start) * item for j in js]
        ends = [self.offset + (j * n + stop) * item for j in js]
        parts = fs.cat_ranges([path] * len(starts), starts, ends)
        out = np.empty((stop - start, len(starts)), dtype=self.dtype)
        for k, part in enumerate(parts):
            if isinstance(part, BaseException):
                raise part
            self._check(len(part), ends[k] - starts[k])
            out[:, k] = np.frombuffer(part, dtype=self.dtype)
        return out

    def _check(self, got: int, want: int) -> None:
        if got != want:
            raise InputError(
                f"{self.url} changed while it was being read ({got} bytes where {want} "
                "were expected); re-run when the file is complete."
            )

    def __getitem__(self, key) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        rows, rest = key[0], key[1:]
        n = self.shape[0]
        if isinstance(rows, slice) and rows.step in (None, 1):
            start, stop, _ = rows.indices(n)
            local: Any = slice(None)
        else:  # any other selection: the bounding range of its rows, then select
            idx = np.arange(n)[rows]
            start, stop = (int(idx.min()), int(idx.max()) + 1) if idx.size else (0, 0)
            local = idx - start
        cols = rest[0] if rest and isinstance(rest[0], slice) else slice(None)
        block = self._rows(start, max(start, stop), cols)[local]
        if self.fortran_order and self.ndim == 2 and rest and isinstance(rest[0], slice):
            rest = rest[1:]  # the read selected the columns already
        return np.array(block[(slice(None), *rest)] if rest else block)

    def __dask_tokenize__(self):
        return ("RemoteNpyFile", self.url, self.shape, self.dtype.str, self.offset)
