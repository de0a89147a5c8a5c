"""Save and load fitted models as a zarr v3 group: numeric arrays + JSON, no pickle.

Layout of a saved model (``attrs["model_kind"]`` says which)::

    model/                  zarr group; attrs hold the JSON description
      eigenvalues           (k,)
      explained_variance_ratio, residuals   (k,)
    exact models ("exact"):
      X_fit                 (n, d) training rows
      eigenvectors          (n, k)
      row_means             (n,)
    Nyström models ("nystroem"): nothing of size n
      landmarks             (m, d) landmark rows
      landmark_indices      (m,) int64, their rows in the training data
      projection            (m, k) A: embedding(x) = k(x, landmarks) A - offset
      offset                (k,)
      landmark_means        (m,) mean_i k(x_i, z_j) (the centring vector)
      mean_weights          (m,) W^+ c (for score_samples)
    with fit_inverse_transform=True (schema 3; attrs["extra"]["preimage"]["method"]):
      preimage_embedding    (s, k) embedding of the rows the learned pre-image was trained on
      preimage_dual_coef    (s, d) its dual coefficients
      preimage_indices      (s,) int64, those rows in the training data
      preimage_mean         (d,) linear kernel only: exact pre-image mean + z @ components
      preimage_components   (k, d) linear kernel only
    distance-based kernels (rbf, laplacian), optional:
      kernel_center         (d,) float64, the training mean the kernel evaluates rows
                            minus (kpca_dask.precision); models without it evaluate on
                            uncentred rows

The attributes record the format name, a schema version, the estimator's
parameters, the kernel (named kernels only: a callable cannot be stored
without pickle), fitted scalars, a SHA-256 of every array and (schema 4) a
SHA-256 of the attributes themselves (``attrs_sha256``, over their canonical
JSON without that record): an edited gamma is refused like an edited array.
Loading reads only numeric arrays and JSON, checks the format, the schema
version and every checksum, and refuses anything else with
:class:`ModelFormatError`: untrusted input never executes code. Models of
schema 1-3 carry no attribute checksum: they load with an
:class:`~kpca_dask.exceptions.UnverifiedAttributesWarning`.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
import warnings
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from .exceptions import ModelFormatError, UnverifiedAttributesWarning
from .removal import remove_owned

__all__ = [
    "FORMAT",
    "SCHEMA_VERSION",
    "ModelState",
    "array_sha256",
    "attrs_sha256",
    "load_state",
    "read_model_group",
    "save_state",
]

FORMAT = "kpca-dask-model"
#: 2 added Nyström models (``model_kind``); version 1 stores are exact models
#: with the same layout and still load. 3 added the pre-image parameters
#: (``fit_inverse_transform``, ``alpha``, ``preimage*``) and arrays; version 1
#: and 2 stores have neither and load as models without a pre-image.
#: 4 added ``attrs_sha256``: a checksum of the attributes (parameters, kernel, fitted
#: scalars...); 1-3 load with an UnverifiedAttributesWarning.
SCHEMA_VERSION = 4
_READABLE_VERSIONS = (1, 2, 3, 4)
_ATTRS_RECORD = "attrs_sha256"

#: arrays every saved model of a kind has; optional ones are listed in attrs["arrays"].
_REQUIRED = {
    "exact": ("eigenvalues", "eigenvectors", "row_means", "X_fit"),
    "nystroem": (
        "eigenvalues",
        "landmarks",
        "landmark_indices",
        "projection",
        "offset",
        "landmark_means",
        "mean_weights",
    ),
}


def _package_version() -> str:
    try:
        return version("kpca-dask")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def array_sha256(a: np.ndarray) -> str:
    """SHA-256 of an array's values (C order, little-endian), dtype and shape."""
    a = np.ascontiguousarray(a)
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    h = hashlib.sha256()
    h.update(f"{a.dtype.str}:{a.shape}".encode())
    h.update(a.reshape(-1).view(np.uint8))  # the bytes in place: no copy of a large X_fit_
    return h.hexdigest()


def attrs_sha256(attrs: dict[str, Any]) -> str:
    """SHA-256 of a model's attributes as canonical JSON (sorted keys, no spaces), without
    the ``attrs_sha256`` record itself."""
    body = {k: v for k, v in attrs.items() if k != _ATTRS_RECORD}
    text = json.dumps(
        body,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ModelState:
    """What a saved model holds: its JSON description and its numeric arrays.

    The estimator converts itself to and from a state (``kpca_dask._state``);
    this module only writes and reads states, and knows no estimator.
    """

    #: "exact" or "nystroem" (``attrs["model_kind"]``)
    kind: str
    #: the estimator's parameters (JSON values)
    params: dict[str, Any]
    #: the kernel's JSON description (``Kernel.to_dict``)
    kernel: dict[str, Any]
    #: dtype name of kernel evaluation
    dtype: str
    #: fitted scalars (``gamma_``, ``n_components_``...)
    fitted: dict[str, Any]
    #: every numeric array, by its saved name
    arrays: dict[str, np.ndarray]
    #: optional parts (``{"preimage": {"method": ...}}``)
    extra: dict[str, Any] = field(default_factory=dict)
    #: where it was read from (for messages; not saved)
    source: str = ""


def save_state(state: ModelState, path: Any, *, overwrite: bool = False) -> None:
    """Write a model state to ``path`` (a folder or zarr store URL), checksummed.

    A local folder is written beside its final name and renamed into place, so
    a reader never sees a half-written model.
    """
    arrays = {k: np.asarray(v) for k, v in state.arrays.items() if v is not None}
    attrs = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "model_kind": state.kind,
        "kpca_dask_version": _package_version(),
        "params": state.params,
        "kernel": state.kernel,
        "dtype": state.dtype,
        "fitted": state.fitted,
        "arrays": sorted(arrays),
        "checksums": {k: array_sha256(v) for k, v in arrays.items()},
        "extra": state.extra,
    }
    local = _local_path(path)
    if local is not None:
        if local.exists() and not overwrite:
            raise FileExistsError(f"{local} exists; pass overwrite=True to replace it.")
        tmp = local.with_name(f".{local.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            _write_group(str(tmp), arrays, attrs)
            if local.exists() or local.is_symlink():
                # only a saved model is replaced: never a link, a user's file or folder
                remove_owned(local, root=local, owned=_is_saved_model)
            os.replace(tmp, local)
        finally:
            if os.path.lexists(tmp):
                remove_owned(tmp, root=tmp, owned=lambda p: p.name == tmp.name)
    else:
        _write_group(path, arrays, attrs, overwrite=overwrite)


def _is_saved_model(p: Path) -> bool:
    """A folder (not a link) whose ``zarr.json`` says it is a kpca-dask model."""
    import json

    try:
        fd = os.open(Path(p) / "zarr.json", os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    return (
        not Path(p).is_symlink()
        and isinstance(meta, dict)
        and (meta.get("attributes") or {}).get("format") == FORMAT
    )


def _local_path(path: Any) -> Path | None:
    if isinstance(path, Path):
        return path
    if isinstance(path, str) and "://" not in path:
        return Path(path)
    if isinstance(path, str) and path.startswith("file://"):
        return Path(path[len("file://") :])
    return None


def _write_group(
    store: Any, arrays: dict[str, np.ndarray], attrs: dict[str, Any], overwrite: bool = False
) -> None:
    root = zarr.open_group(store, mode="w" if overwrite else "w-", zarr_format=3)
    for name, arr in arrays.items():
        # about 32 MB a chunk: zarr encodes a chunk at a time, so the transient copies
        # stay small next to a large X_fit_ (n x d float64)
        row_bytes = max(1, arr.itemsize * int(np.prod(arr.shape[1:])))
        rows = max(1, min(arr.shape[0], (32 << 20) // row_bytes))
        chunks = (rows,) + arr.shape[1:]
        # every chunk stored, also one of zeros: a missing chunk is then always damage
        z = root.create_array(
            name,
            shape=arr.shape,
            dtype=arr.dtype,
            chunks=chunks,
            config={"write_empty_chunks": True},
        )
        # a chunk at a time: zarr encodes the chunks of one write concurrently
        for a in range(0, max(1, arr.shape[0]), rows):
            z[a : a + rows] = arr[a : a + rows]
    # Attributes last: a group without them is not a model. Their checksum is taken over
    # the attributes as zarr stored them (read back), so that any JSON spelling zarr
    # chooses (NaN, float repr) is the one a reader hashes.
    root.attrs.update(attrs)
    stored = dict(zarr.open_group(store, mode="r").attrs)
    root.attrs[_ATTRS_RECORD] = attrs_sha256(stored)


def _read_array(z: Any) -> np.ndarray:
    """The whole zarr array, a chunk row at a time when large: zarr decodes the chunks of
    one read concurrently, which held a third of a large X_fit_ again in chunk buffers."""
    rows = z.chunks[0] if z.ndim else 0
    if z.ndim == 0 or z.shape[0] <= rows or z.nbytes <= 64 << 20:
        return np.asarray(z[...])
    out = np.empty(z.shape, dtype=z.dtype)
    for a in range(0, z.shape[0], rows):
        out[a : a + rows] = z[a : a + rows]
    return out


def read_model_group(
    path: Any, *, stacklevel: int = 3
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Open a saved model: verified attributes and arrays, or ModelFormatError
    (``stacklevel``: of the warning on a model without attribute checksum)."""
    local = _local_path(path)
    if local is not None and not local.exists():
        raise ModelFormatError(f"No saved model at {local}: the folder does not exist.")
    try:
        root = zarr.open_group(path if local is None else str(local), mode="r")
    except ModelFormatError:  # said by the store itself (e.g. its version was removed)
        raise
    except Exception as exc:  # zarr raises several types for unreadable stores
        raise ModelFormatError(f"{path} is not a readable zarr group ({exc}).") from exc
    attrs = dict(root.attrs)
    if attrs.get("format") != FORMAT:
        raise ModelFormatError(
            f"{path} is not a kpca-dask model (format={attrs.get('format')!r}); it may be "
            "incomplete (attributes are written last) or another kind of store."
        )
    sv = attrs.get("schema_version")
    if sv not in _READABLE_VERSIONS:
        raise ModelFormatError(
            f"{path} has model schema_version {sv!r}; this kpca-dask reads versions "
            f"{list(_READABLE_VERSIONS)}. Re-save it with a matching kpca-dask version."
        )
    recorded = attrs.get(_ATTRS_RECORD)
    if sv >= 4 and recorded != attrs_sha256(attrs):
        why = (
            "it has no attribute checksum (incomplete?)"
            if recorded is None
            else "attribute checksum mismatch: its parameters, kernel or fitted values were "
            "modified after it was saved"
        )
        raise ModelFormatError(f"{path}: {why}. Re-create it from the original run.")
    if sv < 4:
        warnings.warn(
            f"{path} is a schema {sv} model: its attributes (parameters, kernel, fitted "
            "values) carry no checksum and cannot be verified; re-save it with this "
            "kpca-dask to cover them.",
            UnverifiedAttributesWarning,
            stacklevel=stacklevel,
        )
    kind = attrs.get("model_kind", "exact")
    if kind not in _REQUIRED:
        raise ModelFormatError(f"{path} has an unknown model_kind {kind!r}.")
    names = attrs.get("arrays", [])
    missing = [k for k in _REQUIRED[kind] if k not in names]
    if missing:
        raise ModelFormatError(f"{path} lacks the arrays {missing}.")
    arrays: dict[str, np.ndarray] = {}
    checksums = attrs.get("checksums", {})
    for name in names:
        try:
            z = root[name]
        except KeyError as exc:
            raise ModelFormatError(f"{path}: array {name!r} is listed but missing.") from exc
        if not isinstance(z, zarr.Array) or z.dtype.kind not in "fiub":
            raise ModelFormatError(
                f"{path}: {name!r} is not a numeric array; refusing to load."
            )
        try:
            a = _read_array(z)
        except ModelFormatError:
            raise
        except Exception as exc:
            raise ModelFormatError(f"{path}: array {name!r} cannot be read ({exc}).") from exc
        if checksums.get(name) != array_sha256(a):
            raise ModelFormatError(
                f"{path}: checksum mismatch for {name!r}; the model was modified or corrupted "
                "after it was saved. Re-create it from the original run."
            )
        arrays[name] = a
    return attrs, arrays


def load_state(path: Any) -> ModelState:
    """Read a saved model's state: verified attributes and arrays, or ModelFormatError.

    Raises :class:`~kpca_dask.exceptions.ModelFormatError` when the store is
    missing, incomplete, of an unknown schema version, or fails its checksums.
    """
    attrs, arrays = read_model_group(path, stacklevel=4)
    params = attrs["params"]
    if not isinstance(params, dict):
        raise ModelFormatError(f"{path}: malformed parameters.")
    extra = attrs.get("extra", {})
    return ModelState(
        kind=attrs.get("model_kind", "exact"),
        params=params,
        kernel=attrs["kernel"],
        dtype=attrs["dtype"],
        fitted=attrs["fitted"],
        arrays=arrays,
        extra=extra if isinstance(extra, dict) else {},
        source=str(path),
    )
