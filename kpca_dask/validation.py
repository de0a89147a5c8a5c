"""Parameter and input validation with uniform, actionable messages."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np

from .exceptions import InvalidInputError, InvalidParameterError
from .rules import (  # noqa: F401  (re-exported: the rules' old home)
    Rule,
    _is_int,
    _is_real,
    int_range,
    options,
    real_range,
    resolve_dtype,
    validate_params,
)

__all__ = [
    "Rule",
    "as_dask_array",
    "check_feature_names",
    "check_finite",
    "describe_missing_chunks",
    "missing_zarr_chunks",
    "resolve_dtype",
    "validate_params",
]


#: more chunks missing than this are refused outright, the grid never enumerated
MAX_MISSING_LISTED = 1_000_000


def missing_zarr_chunks(array: Any) -> list[tuple[int, ...]]:
    """Grid indices of the stored objects (chunks, or shards when sharded) of a zarr array
    that are absent from its store.

    zarr reads an absent chunk as the array's fill value, so a lost chunk file reads as
    zeros without a word. One listing of the array's prefix in its store (cheap: no chunk
    is read), compared with the chunk grid the metadata promise. Note that zarr does not
    write a chunk equal to the fill value unless ``write_empty_chunks`` is set: such an
    array legitimately lacks those chunks (the caller decides whether that is allowed).
    """
    from zarr.core.sync import sync

    store_path = array.store_path
    prefix = store_path.path.strip("/")

    async def _keys() -> list[str]:
        return [k async for k in store_path.store.list_prefix(prefix)]

    present = set()
    for k in sync(_keys()):
        present.add(k[len(prefix) + 1 :] if prefix and k.startswith(prefix + "/") else k)
    grid = array._shard_grid_shape
    total = int(np.prod(grid, dtype=object))
    if total - len(present) > MAX_MISSING_LISTED:
        # A grid this much larger than the store (a shape edited in zarr.json, a copy that
        # never finished) is refused without enumerating it: 1e12 rows claimed over a
        # store of 4 chunks took the process to an out-of-memory kill, with no line.
        name = str(store_path) if array.name in (None, "", "/") else array.name
        raise InvalidInputError(
            f"zarr array {name!r} claims shape {tuple(array.shape)} ({total} chunks) but its "
            f"store holds {len(present)} objects: at least {total - len(present)} chunks are "
            "missing; the shape in its zarr.json is wrong or its data was not copied. "
            "Restore the store (or its zarr.json)."
        )
    encode = array.metadata.encode_chunk_key
    return [idx for idx in np.ndindex(*grid) if encode(idx) not in present]


def describe_missing_chunks(array: Any, missing: list[tuple[int, ...]]) -> str:
    """ "2 of 4 chunks are missing (the first: 'c/2/0', rows 100-149)"."""
    grid = array._shard_grid_shape
    step = (array.shards or array.chunks)[0] if array.ndim else 1
    first = missing[0]
    rows = ""
    if array.ndim:
        lo = first[0] * step
        rows = f", rows {lo}-{min(lo + step, array.shape[0]) - 1}"
    total = int(np.prod(grid))
    return (
        f"{len(missing)} of {total} chunk{'s' if total != 1 else ''} "
        f"{'is' if len(missing) == 1 else 'are'} missing (the first: "
        f"{array.metadata.encode_chunk_key(first)!r}{rows})"
    )


def _zarr_to_dask(X: Any, what: str = "X") -> da.Array | None:
    try:
        import zarr
    except ImportError:  # pragma: no cover
        return None
    if isinstance(X, zarr.Array):
        missing = missing_zarr_chunks(X)
        if missing:
            raise InvalidInputError(
                f"{what} is a zarr array whose store lacks chunks: "
                f"{describe_missing_chunks(X, missing)}; zarr would read them as its fill "
                f"value. Restore the store, or pass dask.array.from_zarr({what}) to read "
                "missing chunks as the fill value deliberately."
            )
        return da.from_zarr(X)
    return None


def as_dask_array(X: Any, what: str = "X") -> tuple[da.Array, str]:
    """Validate the container, shape and dtype of ``X`` (no pass over its values).

    Returns the data as a dask array and the input kind ("numpy", "dask",
    "zarr"; scipy.sparse input counts as "numpy": results come back as numpy).
    Integer and boolean data are cast to float64; object arrays of numbers
    are converted to float64; string and complex data are refused.
    """
    kind = "numpy"
    Xd = _zarr_to_dask(X, what)
    if Xd is not None:
        kind = "zarr"
    elif isinstance(X, da.Array):
        Xd, kind = X, "dask"
    elif _is_sparse(X):
        Xd = sparse_to_dask(X, what)
    else:
        if hasattr(X, "to_numpy") and hasattr(X, "dtypes"):  # pandas DataFrame
            bad = [
                c
                for c, t in X.dtypes.items()
                if not np.issubdtype(t, np.number) and t != bool  # noqa: E721 (numpy dtype)
            ]
            if bad:
                raise InvalidInputError(
                    f"{what} has non-numeric columns {bad[:5]}; select numeric feature columns "
                    "(or encode them) before fitting."
                )
            X = X.to_numpy()
        try:
            arr = np.asarray(X)
        except (ValueError, TypeError) as exc:
            raise InvalidInputError(
                f"{what} cannot be converted to a 2-D numeric array ({exc}); ragged rows? "
                "Every row needs the same number of features."
            ) from exc
        if arr.dtype == object:
            arr = _object_to_float(arr, what)
        _check_dtype(arr.dtype, what)
        Xd = da.from_array(arr, chunks=arr.shape or (1,)) if arr.ndim else None
        if Xd is None:
            raise InvalidInputError(f"Expected a 2-D array for {what}, got a scalar {X!r}.")
    _check_dtype(Xd.dtype, what)
    if Xd.ndim != 2:
        hint = (
            f" Reshape your data with {what}.reshape(-1, 1) for a single feature or "
            f"{what}.reshape(1, -1) for a single sample."
            if Xd.ndim == 1
            else ""
        )
        raise InvalidInputError(
            f"Expected a 2-D array (n_samples, n_features) for {what}, got {Xd.ndim} "
            f"dimension(s) with shape {Xd.shape}.{hint}"
        )
    if any(np.isnan(c) for c in Xd.chunks[0]):
        raise InvalidInputError(
            f"{what} has unknown chunk sizes along the rows; call {what}.compute_chunk_sizes() "
            "first (or to_dask_array(lengths=True) for a dask dataframe)."
        )
    n, d = Xd.shape
    if n == 0 or d == 0:
        # scikit-learn's wording ("0 sample(s) (shape=...) while a minimum of 1 is required")
        which = (
            f"0 sample(s) (shape=({n}, {d}))" if n == 0 else f"0 feature(s) (shape=({n}, {d}))"
        )
        raise InvalidInputError(
            f"{what} is empty: shape ({n}, {d}); found {which} while a minimum of 1 is "
            "required; need at least 1 sample and 1 feature."
        )
    if not np.issubdtype(Xd.dtype, np.floating):
        Xd = Xd.astype(np.float64)
    return Xd, kind


def _check_dtype(dtype: np.dtype, what: str) -> None:
    if np.issubdtype(dtype, np.complexfloating):
        raise InvalidInputError(
            f"Complex data not supported: {what} is {dtype}; kernel PCA needs real numbers "
            "(pass the real part, or the absolute values, as float)."
        )
    if not (np.issubdtype(dtype, np.number) or dtype == bool):  # noqa: E721 (numpy dtype)
        raise InvalidInputError(
            f"{what} has dtype {dtype}, which is not numeric; convert it to float "
            "(non-numeric columns must be encoded or dropped)."
        )


def _block_nonfinite(x: np.ndarray) -> np.ndarray:
    """Count of NaN/inf per column of one block (a 1 x d row)."""
    return np.count_nonzero(~np.isfinite(x), axis=0).astype(np.int64)[None, :]


def column_label(j: int, names: Any = None) -> str:
    """``'name'`` when the columns have names, else ``j`` (0-based index)."""
    if names is not None and 0 <= j < len(names):
        return repr(str(names[j]))
    return str(j)


def _block_stats(x: np.ndarray, ref: np.ndarray, block_info: Any = None) -> np.ndarray:
    """Column sums of ``x - ref`` (float64), minima and maxima of one block: a 1 x 3 x d
    array (NaN propagates into them; they are only read when X is finite). ``ref`` is
    the whole reference row; the block's columns are sliced from it."""
    x = np.asarray(x)
    if block_info is not None and 0 in block_info:
        c0, c1 = block_info[0]["array-location"][1]
        ref = ref[c0:c1]
    if x.shape[0] == 0:
        out = np.zeros((1, 3, x.shape[1]))
        out[0, 1], out[0, 2] = np.inf, -np.inf
        return out
    sums = (np.asarray(x, dtype=np.float64) - ref).sum(axis=0)
    return np.stack([sums, x.min(axis=0), x.max(axis=0)]).astype(np.float64)[None]


@dataclass(frozen=True)
class ColumnStats:
    """Per-column statistics of the training rows, from the finiteness pass."""

    mean: np.ndarray
    min: np.ndarray
    max: np.ndarray
    dtype: np.dtype


def check_finite(
    Xd: da.Array, what: str = "X", names: Any = None, *, column_stats: bool = False
) -> ColumnStats | None:
    """One pass over the values: refuse NaN/inf, naming the first rows and the column
    involved (``names``: the column names, when known).

    ``column_stats=True``: also return the column means (summed in float64), minima and
    maxima, from the same pass (each block is read once for both): the centre of the
    distance-based kernels and what their precision check needs."""
    one_row = ((1,) * len(Xd.chunks[0]), Xd.chunks[1])
    per_block = Xd.map_blocks(_block_nonfinite, chunks=one_row, dtype=np.int64)
    if column_stats:
        # sums of x minus the first row: their rounding is relative to the spread, not
        # the offset, so the mean differs between chunkings far below the grid the
        # kernel centre is rounded to (kpca_dask.precision)
        ref = np.asarray(Xd[:1].compute(), dtype=np.float64).reshape(-1)
        ref = np.where(np.isfinite(ref), ref, 0.0) if ref.size else np.zeros(Xd.shape[1])
        stats = Xd.map_blocks(
            _block_stats,
            ref=ref,
            chunks=((1,) * len(Xd.chunks[0]), (3,), Xd.chunks[1]),
            new_axis=1,
            dtype=np.float64,
        )
        counts2d, stats3d = dask.compute(per_block, stats)
    else:
        (counts2d,) = dask.compute(per_block)
    counts = counts2d.sum(axis=1)
    total = int(counts.sum())
    if total:
        offsets = np.concatenate([[0], np.cumsum(Xd.chunks[0])])
        b = int(np.flatnonzero(counts)[0])
        cols = np.flatnonzero(counts2d[b])
        col = f" in column {column_label(int(cols[0]), names)}" if cols.size else ""
        more = f" (and {cols.size - 1} other column(s))" if cols.size > 1 else ""
        raise InvalidInputError(
            f"{what} contains NaN or infinity ({total} value(s); the first in rows "
            f"{offsets[b]}-{offsets[b + 1] - 1}){col}{more}. Remove or impute them before "
            "fitting (the pipeline's ingest can drop such rows with nonfinite='drop')."
        )
    if column_stats:
        st = np.asarray(stats3d, dtype=np.float64)
        return ColumnStats(
            mean=ref + st[:, 0].sum(axis=0) / max(1, int(Xd.shape[0])),
            min=st[:, 1].min(axis=0),
            max=st[:, 2].max(axis=0),
            dtype=np.dtype(Xd.dtype),
        )
    return None


def check_n_components(n_components: int, n_samples: int) -> None:
    if n_components > n_samples:
        raise InvalidInputError(
            f"n_components={n_components} must be <= n_samples={n_samples}; "
            "ask for fewer components or pass more data."
        )


# ------------------------------------------------------------- scikit-learn inputs
def check_start_vectors(v0: Any, n_samples: int, solver: str) -> np.ndarray:
    """``fit``'s ``v0`` (starting vectors, n_samples x j) as a finite float64 array."""
    if solver == "nystroem":
        raise InvalidParameterError(
            "v0 (starting vectors) warm-starts the exact randomized solver; a Nyström fit "
            "solves an m x m problem directly: leave v0 out, or pass eigen_solver="
            "'randomized'."
        )
    try:
        V0 = np.asarray(v0, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"v0 is not a numeric array: {e}") from None
    if V0.ndim == 1:
        V0 = V0[:, None]
    if V0.ndim != 2 or V0.shape[0] != n_samples or V0.shape[1] == 0:
        raise InvalidInputError(
            f"v0 has shape {V0.shape}; it needs one row per row of X and at least one "
            f"column: ({n_samples}, j)."
        )
    if not np.isfinite(V0).all():
        raise InvalidInputError("v0 contains NaN or infinite values; pass finite vectors.")
    return V0


def _is_sparse(X: Any) -> bool:
    try:
        import scipy.sparse
    except ImportError:  # pragma: no cover
        return False
    return scipy.sparse.issparse(X)


#: Dense bytes of one row block made from a sparse input.
SPARSE_BLOCK_BYTES = 64 << 20


def _densify(block: Any, dtype: np.dtype) -> np.ndarray:
    return np.asarray(block.toarray(), dtype=dtype)


def sparse_to_dask(X: Any, what: str = "X", block_bytes: int = SPARSE_BLOCK_BYTES) -> da.Array:
    """A scipy.sparse matrix or array as a dask array of dense row blocks.

    Any format (CSR, CSC, COO, ...) is converted to CSR once (still sparse);
    each task densifies one row slice of about ``block_bytes``, so the whole
    matrix is never dense at once.
    """
    _check_dtype(X.dtype, what)
    if X.ndim != 2:
        raise InvalidInputError(
            f"Expected a 2-D sparse matrix for {what}, got shape {X.shape}."
        )
    Xc = X.tocsr()
    n, d = (int(s) for s in Xc.shape)
    dtype = np.dtype(X.dtype) if np.issubdtype(X.dtype, np.floating) else np.dtype(np.float64)
    if n == 0 or d == 0:
        return da.zeros((n, d), dtype=dtype)
    rows = max(1, min(n, block_bytes // max(1, d * dtype.itemsize)))
    blocks = [
        da.from_delayed(
            dask.delayed(_densify, pure=True)(Xc[a : a + rows], dtype),
            shape=(min(rows, n - a), d),
            dtype=dtype,
        )
        for a in range(0, n, rows)
    ]
    return blocks[0] if len(blocks) == 1 else da.concatenate(blocks, axis=0)


def _object_to_float(arr: np.ndarray, what: str) -> np.ndarray:
    """Object arrays of numbers become float64 (as scikit-learn does); others are refused."""
    from .exceptions import InvalidInputTypeError

    try:
        return arr.astype(np.float64)
    except TypeError as exc:  # numpy: "float() argument must be a string or a real number"
        raise InvalidInputTypeError(
            f"{what} has dtype object with a value that is not a number ({exc}); convert the "
            "data to float (non-numeric columns must be encoded or dropped)."
        ) from exc
    except ValueError as exc:
        raise InvalidInputError(
            f"{what} has dtype object with values that are not numeric ({exc}); convert the "
            "data to float (non-numeric columns must be encoded or dropped)."
        ) from exc


def feature_names(X: Any) -> np.ndarray | None:
    """Column names of a DataFrame-like ``X`` if all are strings (scikit-learn's rule)."""
    cols = getattr(X, "columns", None)
    if cols is None or not hasattr(X, "dtypes"):
        return None
    names = np.asarray(list(cols), dtype=object)
    if len(names) and all(isinstance(c, str) for c in names):
        return names
    return None


def check_min_samples(n: int, what: str = "X", minimum: int = 2) -> None:
    if n < minimum:
        raise InvalidInputError(
            f"{what} has n_samples={n} (shape[0]); kernel PCA needs at least {minimum} "
            "samples: with 1 sample the centred kernel matrix is zero. Pass more rows."
        )


def check_feature_names(fitted: np.ndarray | None, X: Any) -> Any:
    """Columns by name: ``X`` with the fitted columns in their fitted order.

    ``fitted``: the names seen at fit (``feature_names_in_``) or None. A DataFrame
    whose columns are the fitted ones in another order is reordered (the result is the
    same as in fit's order; scikit-learn refuses it); one that lacks a fitted column
    or has a column the model does not know is refused in one line naming them, with
    scikit-learn's sentences. Without names on either side, scikit-learn's warnings
    (they point at the caller of the estimator method that calls this, two frames up);
    none for dask and zarr arrays, which have no column names (taken by position).
    """
    names = feature_names(X)
    if fitted is None and names is None:
        return X
    if fitted is None:
        warnings.warn(
            "X has feature names, but KernelPCA was fitted without feature names",
            UserWarning,
            stacklevel=4,
        )
        return X
    if names is None:
        if hasattr(X, "columns") or _is_lazy_array(X):
            # non-string column names: scikit-learn's rule is silence; dask and zarr
            # arrays never have names (the pipeline's stores keep the fitted order)
            return X
        warnings.warn(
            "X does not have valid feature names, but KernelPCA was fitted with feature names",
            UserWarning,
            stacklevel=4,
        )
        return X
    if len(names) == len(fitted) and np.all(names == fitted):
        return X
    seen = set(fitted)
    unseen = [str(c) for c in names if c not in seen]
    missing = [str(c) for c in fitted if c not in set(names)]
    dup = sorted({str(c) for c in names if list(names).count(c) > 1})
    if not unseen and not missing and not dup:
        return X[list(fitted)]  # the same columns in another order: select by name
    # scikit-learn's sentences (its checks look for them), on one line
    msg = "The feature names should match those that were passed during fit."
    if unseen:
        msg += f" Feature names unseen at fit time: {_names(unseen)}."
    if missing:
        msg += f" Feature names seen at fit time, yet now missing: {_names(missing)}."
    if dup:
        msg += f" Columns given more than once: {_names(dup)}."
    fix = []
    if unseen:
        fix.append("drop the columns the model does not know")
    if missing:
        fix.append("add the missing ones")
    if dup:
        fix.append("keep one column of each name")
    msg += (
        f" {' and '.join(fix).capitalize()} (the model's features: feature_names_in_), "
        "e.g. X[model.feature_names_in_]."
    )
    raise InvalidInputError(msg)


def _is_lazy_array(X: Any) -> bool:
    if isinstance(X, da.Array):
        return True
    try:
        import zarr
    except ImportError:  # pragma: no cover
        return False
    return isinstance(X, zarr.Array)


def _names(cols: list[str], limit: int = 10) -> str:
    shown = ", ".join(repr(c) for c in cols[:limit])
    return f"[{shown}{f', ... ({len(cols)} in all)' if len(cols) > limit else ''}]"
