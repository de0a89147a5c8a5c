"""Transform: batch inference -- the embedding of rows by a fitted model, chunk by chunk.

:func:`embed_rows` is the one place rows are embedded in batches: the project stage (every
ingested row), denoising (the rows it reconstructs) and :func:`transform_to_store` (new
data, ``kpca transform``) all call it. The model may be given as a run folder (its manifest
is verified first: a run that is not complete, or whose checksums fail, is refused) or as a
model folder (``kpca_dask.load`` verifies its own checksums). The input is read with the
ingest readers (any format, local or fsspec URL) and never loaded whole; the output is a
versioned output folder (pipeline/output/versions.py) whose published version is a zarr
group (``embedding`` plus ``ids``/``labels`` when present) or, when the output path ends in
``.parquet``, holds a Parquet dataset ``embedding.parquet/``;
:func:`pipeline.output.versions.open_output` finds it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dask.array as da
import numpy as np

import kpca_dask
from kpca_dask import one_pass
from pipeline.config import ChunkConfig, InputConfig
from pipeline.data.features import FeatureError
from pipeline.data.features import match as match_features
from pipeline.data.readers import InputError, SourceData, read_input, table_columns
from pipeline.errors import RunError
from pipeline.output import (
    DENSE,
    MANIFEST,
    PARQUET,
    VERSIONS,
    Location,
    check_complete,
    check_transform_output,
    open_run,
    publish_output,
)
from pipeline.runtime import activity, check_locations, compute, transform_targets

from .parquet import component_names, write_parquet

__all__ = [
    "embed_rows",
    "load_model",
    "model_input",
    "open_transform",
    "read_model_input",
    "transform_to_store",
    "verify_transform_output",
]

logger = logging.getLogger("pipeline")


def embed_rows(
    model: Any,
    X: da.Array,
    *,
    split: np.ndarray | None = None,
    idx: np.ndarray | None = None,
    training_data: bool = True,
    dtype: Any = None,
    batch_rows: int | None = None,
    one_read: bool = False,
) -> da.Array:
    """The embedding of rows ``idx`` of ``X`` (every row when None), lazy, row-chunked.

    Exact models (dense, randomized) on the data they were fitted on: the training rows
    (``split == 1``, or every row without a split) take their embedding from the fit,
    ``V sqrt(lambda)`` (what ``fit_transform`` returns; ``transform`` reproduces it to the
    solver's certified residual), so no n x n kernel is evaluated; the other rows go
    through ``model.transform``. Nyström models, and new data (``training_data=False``):
    ``model.transform`` of every row, batch by batch (O(n m), streaming).

    ``batch_rows``: rows per batch and per output chunk (default: ``X``'s row chunks);
    ``dtype``: of the rows taken from the fit (default float64);
    ``one_read``: ``X`` read once, its NaN/inf check in the transform's tasks
    (:mod:`kpca_dask.one_pass`): an ingest store's rows (checked at ingest and by digest).
    """
    rows = X.chunks[0]
    tf = one_pass.transform if one_read else type(model).transform
    out_rows = rows if batch_rows is None else batch_rows
    exact = getattr(model, "eigen_solver_", None) in ("dense", "randomized")
    if not exact or not training_data:
        Xs = X if idx is None else X[idx]
        if batch_rows is not None:
            Xs = Xs.rechunk({0: batch_rows})
        return tf(model, Xs).rechunk({0: out_rows, 1: -1})
    train = model.eigenvectors_ * np.sqrt(model.eigenvalues_)
    if dtype is not None:
        train = train.astype(dtype)
    n = int(X.shape[0])
    sel = np.arange(n) if idx is None else idx
    is_train = np.ones(n, dtype=bool) if split is None else split.astype(bool)
    pos = np.cumsum(is_train) - 1  # training row r is row pos[r] of the fit's embedding
    Z = np.empty((sel.size, train.shape[1]), dtype=np.float64 if dtype is None else dtype)
    t = is_train[sel]
    Z[t] = train[pos[sel[t]]]
    if (~t).any():
        (Z[~t],) = compute(tf(model, X[sel[~t]]), label="embed held-out rows")
    return da.from_array(Z, chunks=(out_rows, -1))


def _run_folder_of(loc: Location) -> Location | None:
    """The run folder ``loc`` is the ``model/`` of, if it is one (its group says so)."""
    if not loc.is_local:
        parent_url = loc.url.rstrip("/").rsplit("/", 1)[0]
        parent = Location(parent_url, loc.storage_options)
    else:
        parent = Location(str(loc.local_path.parent))
    if loc.url.rstrip("/").rsplit("/", 1)[-1] != "model":
        return None
    try:
        kind = dict(parent.open_group("r").attrs).get("kind")
    except Exception:
        return None
    return parent if kind == "kpca-dask-run" else None


def _split_version(loc: Location) -> tuple[Location, str] | None:
    """``(output root, version id)`` when ``loc`` is a version folder
    (``<root>/versions/<id>``)."""
    url = str(loc.local_path) if loc.is_local else loc.url.rstrip("/")
    head, _, vid = url.rpartition("/")
    head, _, name = head.rpartition("/")
    if name != VERSIONS or not head or not vid:
        return None
    return Location(head, loc.storage_options), vid


def load_model(path: str | Location, storage_options: dict | None = None) -> Any:
    """A model from a run (its published version, verified) or a model folder, local or
    at a URL read with ``storage_options``.

    The ``model/`` folder of a run is accepted only if its run verifies and, inside a
    versioned output, only for a published version: a model left by a run that did not
    finish (or was tampered with) is refused like the run itself.
    """
    loc = Location.at(path, storage_options)
    is_run = any(loc.child(name).exists() for name in (MANIFEST, VERSIONS, "model"))
    run = loc if is_run else _run_folder_of(loc)
    if run is None and not loc.exists():
        _refuse_earlier_model_path(loc)
    if run is not None:
        split = _split_version(run)
        pub = open_run(run) if split is None else open_run(split[0], version=split[1])
        loc = pub.model
    return kpca_dask.load(loc.zarr_source())


def _refuse_earlier_model_path(loc: Location) -> None:
    """``<out>/model`` of a versioned output (the path an earlier release documented, gone
    since the output was migrated): one line naming the output to pass instead."""
    from pipeline.output import read_pointer

    url = str(loc.local_path) if loc.is_local else loc.url.rstrip("/")
    head, _, name = url.rpartition("/")
    if name != "model" or not head:
        return
    root = Location(head, loc.storage_options)
    try:
        pointer = read_pointer(root)
    except Exception:  # noqa: BLE001 - not an output of ours: the loader's own message
        return
    if isinstance(pointer, dict) and isinstance(pointer.get("version"), str):
        raise RunError(
            f"{url} does not exist: {head} keeps its model in its published version "
            f"({pointer.get('version_path') or VERSIONS}/model; the top-level model/ of an "
            f"earlier release's layout is gone); pass the output {head} itself, which uses "
            "its published model."
        )


def open_transform(
    model_path: str,
    input_cfg: InputConfig,
    output: str,
    chunks: ChunkConfig | None,
    overwrite: bool,
    storage_options: dict | None,
    ignore_extra: bool = False,
) -> tuple[Location, Any, SourceData]:
    """What a transform (or a denoise) of ``input_cfg`` with a saved model starts from:
    the checked output location (refused before anything is read, see
    :func:`pipeline.output.publish.check_transform_output`; then the visibility probe of the
    model, input and output on the Dask workers), the model, and the input's rows
    with their columns matched to the model's features by name."""
    out = check_transform_output(
        output,
        model_path=model_path,
        inputs=[input_cfg.path],
        overwrite=overwrite,
        storage_options=storage_options,
    )
    # every worker sees the model, the input and the output, before the model is read
    # (verified on the workers) or anything written (pipeline/runtime/visibility.py)
    check_locations(transform_targets(model_path, input_cfg, out, storage_options))
    model = load_model(model_path, storage_options)
    src = read_model_input(model, input_cfg, chunks, ignore_extra=ignore_extra)
    return out, model, src


def transform_to_store(
    model_path: str,
    input_cfg: InputConfig,
    output: str,
    *,
    chunks: ChunkConfig | None = None,
    overwrite: bool = False,
    storage_options: dict | None = None,
    ignore_extra: bool = False,
    keep_versions: int | None = None,
    retention_grace_hours: float | None = None,
) -> dict:
    """Embed ``input_cfg``'s rows with the model; write zarr or Parquet at ``output``.

    ``storage_options``: fsspec options of the model's and the output's URLs (the input
    has its own, ``input_cfg.storage_options``). The input's columns are matched to the
    model's features by name and the run's id and label columns reused
    (:func:`read_model_input`).

    The output is refused before anything is read when it is ``""``/``.``, the input, a
    run folder or inside the model's run, a link, or an existing path kpca did not write
    (see :func:`pipeline.output.publish.check_transform_output`). It is written as a new
    version of the output, checked, and published by one atomic write of
    ``<output>/manifest.json`` under the output's lock (pipeline/output/versions.py): a failed
    transform leaves the previous output as it was, and of two transforms to one output
    exactly one publishes. Readers open it with :func:`pipeline.output.versions.open_output`.
    """
    t0 = time.perf_counter()
    with activity("transform"):
        return _transform_to_store(
            model_path,
            input_cfg,
            output,
            chunks,
            overwrite,
            storage_options,
            ignore_extra,
            t0,
            (keep_versions, retention_grace_hours),
        )


def _transform_to_store(
    model_path, input_cfg, output, chunks, overwrite, storage_options, ignore_extra, t0, keep
) -> dict:
    keep_versions, retention_grace_hours = keep  # how many versions kept, and how long
    out, model, src = open_transform(
        model_path, input_cfg, output, chunks, overwrite, storage_options, ignore_extra
    )
    emb = embed_rows(model, src.X, training_data=False)
    n = int(src.X.shape[0])
    parquet = output.rstrip("/").endswith(".parquet")

    def write(version: Location) -> None:
        _write_embedding(version, emb, src, parquet, model_path, input_cfg.path)

    def verify(version: Location) -> None:
        verify_transform_output(
            version.child(PARQUET) if parquet else version,
            n_rows=n,
            n_components=int(emb.shape[1]),
            parquet=parquet,
        )

    def recheck() -> None:  # under the lock: another transform may have published meanwhile
        check_transform_output(
            output,
            model_path=model_path,
            inputs=[input_cfg.path],
            overwrite=overwrite,
            storage_options=storage_options,
        )

    pointer = publish_output(
        output,
        write=write,
        verify=verify,
        recheck=recheck,
        storage_options=storage_options,
        keep=keep_versions,
        grace=None if retention_grace_hours is None else retention_grace_hours * 3600,
        record={
            "kind": "kpca-dask-transform",
            "format": "parquet" if parquet else "zarr",
            "data": PARQUET if parquet else ".",
            "rows": n,
            "components": int(emb.shape[1]),
            "model": model_path,
            "input": input_cfg.path,
        },
    )
    secs = time.perf_counter() - t0
    logger.info(
        "transform: %d rows -> %s (version %s) in %.1f s", n, output, pointer["version"], secs
    )
    return {
        "rows": n,
        "components": int(emb.shape[1]),
        "output": output,
        "version": pointer["version"],
        "seconds": secs,
    }


def row_array_stores(g, src, rows: int) -> list:
    """The (uncomputed) writes of the rows' ids and labels, when the source has them, as
    arrays of ``g`` beside the output array, in chunks of ``rows``."""
    stores = []
    for name, arr in (("ids", src.ids), ("labels", src.labels)):
        if arr is not None:
            dtype = str if arr.dtype.kind in "OUT" else arr.dtype
            za = g.create_array(
                name, shape=arr.shape, dtype=dtype, chunks=(rows,), config=DENSE
            )
            stores.append(da.store(arr, za, lock=False, compute=False))
    return stores


def _write_embedding(
    version: Location, emb, src, parquet: bool, model_path: str, input_path: str
) -> None:
    """Write the embedding (with the rows' ids and labels) into a new output version: one
    Parquet file, or a zarr group of dense arrays marked complete."""
    if parquet:
        write_parquet(
            version, emb, ids=src.ids, labels=src.labels, classes=src.classes, name=PARQUET
        )
        return
    rows = src.X.chunks[0][0]
    g = version.open_group("a")
    z = g.create_array(
        "embedding", shape=emb.shape, dtype=emb.dtype, chunks=(rows, emb.shape[1]), config=DENSE
    )
    z.attrs["columns"] = component_names(emb.shape[1])
    stores = [da.store(emb, z, lock=False, compute=False), *row_array_stores(g, src, rows)]
    compute(*stores, label="transform")
    g.attrs.update(
        {
            "kind": "kpca-dask-transform",
            "model": model_path,
            "input": input_path,
            "status": "complete",
        }
    )


def model_input(
    model: Any, input_cfg: InputConfig, *, ignore_extra: bool = False
) -> InputConfig:
    """``input_cfg`` with the columns to read for ``model``: its features by name, in its
    order, and the run's id and label columns when the table has them.

    Applies when the model records its features by name (the "features" block a run
    saves) and the input is a table (CSV/Parquet). NPY and zarr input have no names: their
    columns are taken by position. ``input_cfg.columns``, when given, must name the
    model's features (any order). Raises InputError naming a missing feature, or a column
    the model does not know when the run took every column (pipeline/data/features.py).
    """
    block = getattr(model, "features_", None)
    if not block or block.get("selection") == "positions":
        return input_cfg
    cols = table_columns(input_cfg)
    if cols is None:
        logger.info(
            "transform: %s has no column names; its %s columns are taken by position as "
            "the model's features %s",
            input_cfg.path,
            model.n_features_in_,
            block["names"][:10],
        )
        return input_cfg
    available, _ = cols
    names = list(block["names"])
    if input_cfg.columns is not None:
        given = list(input_cfg.columns)
        if sorted(given) != sorted(names):
            unknown = [c for c in given if c not in names]
            missing = [c for c in names if c not in given]
            raise InputError(
                f"--columns must name the model's {len(names)} features (any order): "
                + "; ".join(
                    part
                    for part in (
                        f"not features: {unknown}" if unknown else "",
                        f"missing: {missing[:10]}" if missing else "",
                    )
                    if part
                )
                + "; or leave --columns out: the features are selected by name."
            )
    try:
        m = match_features(
            block,
            input_cfg.path,
            available,
            id_column=input_cfg.id_column,
            label_column=input_cfg.label_column,
            ignore_extra=ignore_extra or input_cfg.columns is not None,
        )
    except FeatureError as exc:
        raise InputError(str(exc)) from None
    return input_cfg.model_copy(
        update={"columns": m.features, "id_column": m.id_column, "label_column": m.label_column}
    )


def read_model_input(
    model: Any,
    input_cfg: InputConfig,
    chunks: ChunkConfig | None = None,
    *,
    ignore_extra: bool = False,
) -> SourceData:
    """The rows to embed with ``model``: columns by name (:func:`model_input`), checked
    against the model's feature count. A label column reused from the run that the new
    rows cannot be read with (one class only) is left out, with a note."""
    cfg = model_input(model, input_cfg, ignore_extra=ignore_extra)
    check_rows(cfg)
    try:
        src = read_input(cfg, chunks)
    except InputError as exc:
        label = cfg.label_column
        reused = label is not None and input_cfg.label_column is None
        if not (reused and str(exc).startswith(f"label column {label!r} has")):
            raise
        logger.info("transform: not carrying the label column %r (%s)", label, exc)
        src = read_input(cfg.model_copy(update={"label_column": None}), chunks)
    if src.X.shape[1] != model.n_features_in_:
        raise InputError(
            f"{input_cfg.path} has {src.X.shape[1]} feature columns but the model "
            f"was fitted on {model.n_features_in_}; select the same columns "
            "(input.columns) as in training."
        )
    return src


def check_rows(cfg: InputConfig) -> None:
    """Every row of the rows to embed read once before the embedding starts
    (pipeline/data/validate.py): NaN/inf and text in a feature column, a missing id, with the
    row and column; PrestartError. Labels may be missing (a transform carries them,
    it does not need them); a repeated id is logged, not refused."""
    from pipeline.data.validate import PrestartError, validate_input

    v = validate_input(cfg.model_copy(update={"label_column": None}))
    for f in v.errors:
        if f.check == "duplicate_id":
            logger.warning("transform: %s", f.message)
    errors = [f for f in v.errors if f.check != "duplicate_id"]
    if errors:
        raise PrestartError(errors)


def _parent_and_name(loc: Location) -> tuple[Location, str]:
    if loc.is_local:
        return Location(str(loc.local_path.parent)), loc.local_path.name
    url = loc.url.rstrip("/")
    return Location(url.rsplit("/", 1)[0], loc.storage_options), url.rsplit("/", 1)[1]


def verify_transform_output(
    target: Location,
    *,
    n_rows: int,
    n_components: int | None,
    parquet: bool,
    array: str = "embedding",
) -> None:
    """Raise RunError unless ``target`` is a complete transform output of ``n_rows`` rows
    (zarr: with every chunk of every array in the store, :func:`check_complete`)."""
    from pipeline.errors import RunError

    if parquet:
        import pyarrow.dataset as pads

        ds = pads.dataset(target.fs_path, format="parquet", filesystem=target.fs)
        rows = ds.count_rows()
        ok = rows == n_rows
    else:
        g = target.open_group("r")
        z = g[array] if array in g else None
        rows = None if z is None else z.shape[0]
        ok = (
            z is not None
            and rows == n_rows
            and dict(g.attrs).get("status") == "complete"
            and (n_components is None or z.shape[1] == n_components)
        )
    if not ok:
        raise RunError(
            f"the new output at {target} is incomplete ({rows} of {n_rows} rows); "
            "nothing was published, the previous output is unchanged."
        )
    if not parquet:  # every chunk of every array there, or it would read as zeros
        check_complete(target)
