"""The pre-start checks of the input (pipeline/data/validate.py): it exists and can be opened,
its format, and for NPY and zarr its header (dtype, shape) and first rows; tables in
pipeline/data/checks/tables.py. Each problem becomes a :class:`Finding`."""

from __future__ import annotations

import json
import posixpath

from pipeline.config import PipelineConfig

from .findings import (
    SAMPLE_ROWS,
    Finding,
    Stop,
    Validation,
    input_format,
    open_fs,
    short,
    unreachable,
)
from .rows import check_sample_finite, scan_rows
from .tables import check_table

__all__ = ["MAX_FILL_CHUNKS", "check_evaluate", "check_input"]

#: above this many chunk objects missing from the grid a zarr array's metadata promise,
#: the input is refused even with ``input.missing_chunks: fill``: a million chunks of the
#: fill value is a damaged or edited ``zarr.json`` (say a shape of 1e12 rows), never data
#: to analyse (issue 36; pipeline/data/readers/zarr_array.py applies the same bound).
MAX_FILL_CHUNKS = 1_000_000


def check_input(cfg: PipelineConfig, v: Validation) -> None:
    inp = cfg.input
    try:
        fs, fs_path = open_fs(inp.path, dict(inp.storage_options))
    except ImportError as exc:
        raise Stop(
            f"cannot open {inp.path!r}: {short(exc)} (install the fsspec backend for this "
            "URL scheme, e.g. `pip install s3fs`)."
        ) from None
    except Exception as exc:  # noqa: BLE001 - an unknown protocol, bad storage options
        raise Stop(
            f"cannot open {inp.path!r} ({type(exc).__name__}: {short(exc)}); check "
            "input.path and input.storage_options."
        ) from None
    try:
        exists = fs.exists(fs_path)
    except Exception as exc:  # noqa: BLE001 - network, credentials, permissions
        raise unreachable(exc)(
            f"cannot reach input {inp.path!r} ({type(exc).__name__}: {short(exc)}); check "
            "the URL, the network and the credentials in the environment."
        ) from None
    if not exists:
        raise Stop(f"input {inp.path!r} does not exist; check input.path.")
    fmt = input_format(cfg, fs, fs_path)
    if fmt is None:
        v.findings.append(
            Finding(
                "format",
                f"cannot infer the format of {inp.path!r} from its name; set input.format "
                "to one of npy, csv, parquet, zarr.",
            )
        )
        return
    v.format = fmt
    if fmt in ("npy", "zarr") and (inp.columns or inp.label_column or inp.id_column):
        v.findings.append(
            Finding(
                "columns",
                f"{fmt.upper() if fmt == 'npy' else fmt} input has no named columns: remove "
                "input.columns/label_column/id_column, or convert the data to Parquet/CSV.",
            )
        )
        return
    try:
        if fmt == "npy":
            _check_npy(cfg, v, fs, fs_path)
        elif fmt == "zarr":
            _check_zarr(cfg, v, fs, fs_path)
        else:
            check_table(cfg, v, fs, fs_path, fmt)
    except PermissionError as exc:
        raise Stop(
            f"cannot read input {inp.path!r}: permission denied ({short(exc)}); give this "
            "user read access or point input.path at a readable copy."
        ) from None
    except IsADirectoryError:
        raise Stop(
            f"input {inp.path!r} is a folder, not a {fmt} file; point input.path at the "
            "file (or set input.format)."
        ) from None


def _check_matrix(cfg, v: Validation, dtype, shape) -> None:
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        v.findings.append(
            Finding(
                "types", f"{cfg.input.path}: complex values; kernel PCA needs real numbers."
            )
        )
    elif dtype.kind not in "fiub":
        v.findings.append(
            Finding(
                "types",
                f"{cfg.input.path}: dtype {dtype} is not numeric; store numbers (encode "
                "categorical columns first).",
            )
        )
    if len(shape) != 2:
        v.findings.append(
            Finding(
                "types",
                f"{cfg.input.path} holds an array of shape {tuple(shape)}; need 2-D "
                "(n_samples, n_features).",
            )
        )
    elif shape[0] == 0 or shape[1] == 0:
        v.findings.append(
            Finding(
                "types",
                f"{cfg.input.path} holds an empty array of shape {tuple(shape)}; point "
                "input.path at data.",
            )
        )
    v.shape = tuple(int(s) for s in shape)
    if len(shape) == 2:
        v.features = [f"x{i}" for i in range(int(shape[1]))]


def _check_npy(cfg, v: Validation, fs, fs_path: str) -> None:
    import numpy as np
    from numpy.lib import format as npformat

    with fs.open(fs_path, "rb") as f:
        try:
            version = npformat.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npformat.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = npformat.read_array_header_2_0(f)
        except Exception as exc:  # noqa: BLE001 - not an NPY file (an NPZ, text, truncated)
            head = b""
            try:
                f.seek(0)
                head = f.read(4)
            except Exception:  # noqa: BLE001
                pass
            if head.startswith(b"PK"):  # np.load opens NPZ archives whatever the name
                v.findings.append(
                    Finding(
                        "types",
                        f"{cfg.input.path} is an NPZ archive, not an NPY file; save the "
                        "feature matrix with numpy.save and point input.path at it.",
                    )
                )
                return
            v.findings.append(
                Finding(
                    "types",
                    f"{cfg.input.path} is not a readable NPY file: {short(exc)}",
                )
            )
            return
        if dtype.hasobject:
            v.findings.append(
                Finding(
                    "types",
                    f"{cfg.input.path}: object arrays are refused (loading them would "
                    "unpickle data); save numeric data.",
                )
            )
            return
        _check_matrix(cfg, v, dtype, shape)
        if v.errors or len(shape) != 2 or fortran:
            return
        rows = min(SAMPLE_ROWS, int(shape[0]))
        want = rows * int(shape[1]) * dtype.itemsize
        buf = f.read(want)
    if len(buf) < want:
        v.findings.append(
            Finding(
                "types",
                f"{cfg.input.path} is truncated (its header says {tuple(shape)}); restore "
                "the file from a good copy.",
            )
        )
        return
    sample = np.frombuffer(buf, dtype=dtype).reshape(rows, int(shape[1]))
    v.sample_rows = rows
    check_sample_finite(cfg, v, sample, v.features)
    if not v.errors and v.full:
        scan_rows(cfg, v, fs, fs_path, "npy", v.features)


def _check_zarr(cfg, v: Validation, fs, fs_path: str) -> None:
    def meta(path: str) -> dict | None:
        try:
            with fs.open(posixpath.join(path, "zarr.json"), "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError) as exc:
            raise Stop(
                f"{cfg.input.path} is not a readable zarr store ({type(exc).__name__}: "
                f"{short(exc)}); restore it from a good copy or point input.path at an "
                "intact store."
            ) from None

    apath = fs_path
    m = meta(fs_path)
    if m is None:
        v.findings.append(
            Finding(
                "types",
                f"{cfg.input.path} is not a zarr v3 store (no zarr.json); point input.path "
                "at the store, or set input.format.",
            )
        )
        return
    if m.get("node_type") == "group":
        name = cfg.input.zarr_array or "X"
        apath = posixpath.join(fs_path, name)
        m = meta(apath)
        if m is not None and m.get("node_type") == "group":
            v.findings.append(
                Finding(
                    "columns",
                    f"{cfg.input.path}: {name!r} is a zarr group, not an array; set "
                    "input.zarr_array to an array's path.",
                )
            )
            return
        if m is None or m.get("node_type") != "array":
            v.findings.append(
                Finding(
                    "columns",
                    f"{cfg.input.path} is a zarr group without an array {name!r}; set "
                    "input.zarr_array to the feature array's path.",
                )
            )
            return
    dtype = m.get("data_type")
    try:
        import numpy as np

        dt = np.dtype(dtype) if isinstance(dtype, str) else np.dtype("O")
    except TypeError:
        dt = np.dtype("O")
    _check_matrix(cfg, v, dt, m.get("shape") or ())
    if not v.errors:
        _check_zarr_grid(cfg, v, fs, apath, m)


def _check_zarr_grid(cfg, v: Validation, fs, apath: str, m: dict) -> None:
    """A shape the store cannot hold (a ``zarr.json`` claiming 1e12 rows over a few
    chunk files) is refused here, before anything is read or allocated: the listing is
    taken only when the claimed grid is larger than :data:`MAX_FILL_CHUNKS`."""
    import math

    try:
        shape = [int(s) for s in m["shape"]]
        step = [int(c) for c in m["chunk_grid"]["configuration"]["chunk_shape"]]
        total = math.prod(-(-s // c) for s, c in zip(shape, step, strict=True))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return  # not a regular grid: the reader checks what zarr makes of it
    if total <= MAX_FILL_CHUNKS:
        return
    try:
        held = sum(
            1
            for p in fs.find(apath)
            if posixpath.basename(p) not in ("zarr.json", ".zarray", ".zattrs")
        )
    except Exception:  # noqa: BLE001 - the reader lists it again and says why
        return
    if total - held > MAX_FILL_CHUNKS:
        v.findings.append(
            Finding(
                "types",
                f"{cfg.input.path}: its zarr.json claims shape {tuple(shape)} in {total} "
                f"chunks but the store holds {held} chunk object"
                f"{'s' if held != 1 else ''}; the metadata are damaged or the chunks "
                "lost. Restore the store from a good copy (or fix the shape in zarr.json).",
            )
        )


def check_evaluate(cfg: PipelineConfig, v: Validation) -> None:
    if cfg.evaluate.enabled is True and not cfg.input.label_column:
        v.findings.append(
            Finding(
                "evaluate",
                "evaluate.enabled is true but the input has no label column; set "
                "input.label_column or evaluate.enabled: auto.",
            )
        )
