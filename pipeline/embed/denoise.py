"""Denoise stage: pre-images of the embedding, written next to it as ``<out>/denoised``.

Kernel PCA denoising (Mika, Schölkopf, Smola et al. 1999): embed a row, keep
its projection on the leading components, map it back to input space. The
solve stage fits the pre-image with the model when ``denoise.enabled`` is true
(:func:`estimator_params` gives the estimator parameters it adds); this stage
loads the model from the run's ``model/`` folder, embeds the selected ingested
rows and writes their pre-images (``kpca_dask.KernelPCA.inverse_transform``).

How rows are embedded (as the project stage does): exact models take the
training rows' embedding from the model (``V sqrt(lambda)``, no n x n pass)
and ``transform`` the held-out rows; Nyström models ``transform`` every row
(``O(n m)``, streaming). The pre-images are computed lazily, block by block,
and stored with the ingested row chunks; nothing of size n x n is formed.
Cost per row: learned ``s (k + d)``, exact (linear kernel) ``k d``, fixed point
``(k + d)`` per iteration times the model's expansion size (its landmarks,
or every training row of an exact model).

Layout (docs/artifacts.md)::

    <out>/denoised        (n_rows, n_features) in the model's dtype; attrs: columns,
                          method, rows; row i is ingested row i when rows="all"
    <out>/denoised_rows   (n_rows,) int64 ingested row index of each denoised row,
                          present only when a subset is denoised
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dask.array as da
import numpy as np

from pipeline.config import DenoiseConfig
from pipeline.errors import UserError
from pipeline.output import DENSE, Location
from pipeline.runtime import compute

from .transform import embed_rows

__all__ = [
    "DenoiseConfig",
    "DenoiseError",
    "estimator_params",
    "select_rows",
    "denoise_rows",
    "stage_denoise",
    "denoise_to_store",
]

logger = logging.getLogger("pipeline")


class DenoiseError(UserError, ValueError):
    """Denoising cannot run as configured; the message says what to change."""


def estimator_params(cfg: DenoiseConfig) -> dict[str, Any]:
    """KernelPCA parameters the solve stage adds so the model can denoise ({} if disabled)."""
    if not cfg.enabled:
        return {}
    return {
        "fit_inverse_transform": True,
        "alpha": cfg.alpha,
        "preimage": cfg.preimage,
        "preimage_sample_size": cfg.sample_size,
        "preimage_tol": cfg.tol,
        "preimage_max_iter": cfg.max_iter,
    }


def select_rows(cfg: DenoiseConfig, n_rows: int, split: np.ndarray | None) -> np.ndarray | None:
    """Ingested row indices to denoise (sorted int64), or None for every row."""
    if cfg.rows == "all":
        idx = None
    elif split is None:
        raise DenoiseError(
            f"denoise.rows={cfg.rows!r} needs held-out rows, but this run has no "
            "split (it holds rows out only for evaluation of labelled input); "
            "use denoise.rows: all."
        )
    else:
        mask = split.astype(bool)
        idx = np.flatnonzero(~mask if cfg.rows == "held_out" else mask).astype(np.int64)
    if cfg.max_rows is not None and (
        idx is None and n_rows > cfg.max_rows or idx is not None and idx.size > cfg.max_rows
    ):
        idx = np.arange(cfg.max_rows, dtype=np.int64) if idx is None else idx[: cfg.max_rows]
    return idx


def _check_model(model: Any, cfg: DenoiseConfig, where: str) -> str | None:
    """Refuse a model without a pre-image, or one fitted for another denoise config;
    returns the ``method`` to pass to inverse_transform."""
    if not hasattr(model, "dual_coef_"):
        raise DenoiseError(
            f"the model at {where} has no pre-image (it was fitted with "
            "fit_inverse_transform=False); with denoise.enabled: true the solve stage fits "
            "one -- re-run the solve stage."
        )
    fitted = model.get_params(deep=False)
    for ours, theirs in (("alpha", "alpha"), ("sample_size", "preimage_sample_size")):
        if fitted[theirs] != getattr(cfg, ours):
            raise DenoiseError(
                f"the model at {where} fitted its pre-image with {theirs}={fitted[theirs]!r} "
                f"but denoise.{ours}={getattr(cfg, ours)!r}; re-run the solve stage with this "
                "config."
            )
    model.set_params(preimage_tol=cfg.tol, preimage_max_iter=cfg.max_iter)
    return None if cfg.preimage == "auto" else cfg.preimage


def denoise_rows(
    model: Any,
    X: da.Array,
    cfg: DenoiseConfig,
    *,
    split: np.ndarray | None = None,
    where: str = "the model",
    training_data: bool = True,
) -> tuple[da.Array, da.Array, np.ndarray | None]:
    """Lazy pre-images of the selected rows: ``(denoised, status, row_index or None)``.

    ``training_data``: X holds the rows the model was fitted on (with ``split``
    marking them), so an exact model's training embedding is reused; False
    (new data) transforms every row.
    """
    idx = select_rows(cfg, int(X.shape[0]), split)  # a config problem first
    method = _check_model(model, cfg, where)
    if X.shape[1] != model.n_features_in_:
        raise DenoiseError(
            f"the data have {X.shape[1]} features but the model was fitted on "
            f"{model.n_features_in_}."
        )
    Z = embed_rows(
        model, X, split=split, idx=idx, training_data=training_data, batch_rows=X.chunks[0][0]
    )
    den, status = model.inverse_transform(Z, method=method, return_status=True)
    return den, status, idx


def _write(g, name: str, arr: da.Array, chunk_rows: int):
    if name in g:
        del g[name]
    return g.create_array(
        name,
        shape=arr.shape,
        dtype=arr.dtype,
        chunks=(chunk_rows,) + tuple(arr.shape[1:]),
        config=DENSE,
    )


def _drop_previous(g) -> None:
    """Delete the arrays an earlier denoise stage wrote (listed in the run group's attrs)."""
    for name in g.attrs.get(WRITTEN_ATTR, []):
        if name in g:
            del g[name]
    if WRITTEN_ATTR in g.attrs:
        del g.attrs[WRITTEN_ATTR]


#: run-group attribute listing the arrays the denoise stage wrote (for clean re-runs)
WRITTEN_ATTR = "denoised_arrays"


def stage_denoise(cfg: Any, ing: Any, split: Any, solved: Any) -> dict[str, Any]:
    """Denoised rows of the run (``cfg.denoise``): ``<out>/<denoise.output_name>``.

    ``cfg`` is the run's PipelineConfig. Idempotent: the arrays are replaced,
    and a run with denoising disabled removes a stale one. Returns a small
    JSON-able descriptor (rows, method, fixed-point fallbacks, mean squared
    change per value). ``ing``, ``split``, ``solved``: the typed results of those
    stages (pipeline/runner/results.py).
    """
    import kpca_dask
    from pipeline.data.stage_data import ingested, read_split
    from pipeline.output import run_layout

    dcfg = cfg.denoise
    layout = run_layout(cfg)
    out = layout.out
    g = out.open_group("a")
    _drop_previous(g)  # a re-run (disabled, or to another name) leaves no stale rows behind
    if not dcfg.enabled:
        return {"enabled": False}
    t0 = time.perf_counter()
    res, src = ingested(ing)
    model = kpca_dask.load(layout.model.zarr_source())  # the version being written's
    mask = read_split(layout, split)
    den, status, idx = denoise_rows(model, src.X, dcfg, split=mask, where=str(layout.model))
    X_sel = src.X if idx is None else src.X[idx]
    sq_change = ((den.astype(np.float64) - X_sel.rechunk({0: den.chunks[0]})) ** 2).sum()
    chunk_rows = int(src.X.chunks[0][0])
    z = _write(g, dcfg.output_name, den, chunk_rows)
    z.attrs.update(
        {
            "columns": list(res.columns),
            "method": model.preimage_ if dcfg.preimage == "auto" else dcfg.preimage,
            "rows": dcfg.rows,
        }
    )
    index_name = f"{dcfg.output_name}_rows"
    stores = [da.store(den, z, lock=False, compute=False)]
    written = [dcfg.output_name]
    if idx is not None:
        zi = _write(g, index_name, da.from_array(idx, chunks=chunk_rows), chunk_rows)
        zi[...] = idx
        written.append(index_name)
    g.attrs[WRITTEN_ATTR] = written
    _, st, total = compute(stores[0], status, sq_change, label="denoise")
    n_sel = int(den.shape[0])
    counts = np.bincount(np.asarray(st, dtype=np.int64), minlength=3)
    info = {
        "enabled": True,
        "array": dcfg.output_name,
        "index_array": index_name if idx is not None else None,
        "arrays": written,
        "rows": n_sel,
        "n_features": int(den.shape[1]),
        "selection": dcfg.rows,
        "method": z.attrs["method"],
        "alpha": dcfg.alpha,
        "sample_size": int(model.dual_coef_.shape[0]),
        "fixed_point_not_converged": {"max_iter": int(counts[1]), "diverged": int(counts[2])},
        "mean_squared_change": float(total) / max(1, n_sel * int(den.shape[1])),
        "seconds": time.perf_counter() - t0,
    }
    if counts[1] or counts[2]:
        logger.warning(
            "denoise: the fixed point did not converge for %d of %d rows (they hold "
            "the learned pre-image)",
            int(counts[1] + counts[2]),
            n_sel,
        )
    logger.info(
        "denoise: %d rows -> %s/%s (%s) in %.1f s",
        n_sel,
        out,
        dcfg.output_name,
        info["method"],
        info["seconds"],
    )
    return info


def denoise_to_store(
    model_path: str,
    input_cfg: Any,
    output: str,
    *,
    chunks: Any = None,
    method: str | None = None,
    overwrite: bool = False,
    storage_options: dict | None = None,
    ignore_extra: bool = False,
    keep_versions: int | None = None,
    retention_grace_hours: float | None = None,
) -> dict[str, Any]:
    """``kpca transform --inverse``: denoised rows of new data with a saved model (zarr).

    ``storage_options``: of the model's and the output's URLs (the input has its own).

    Publishes a new version of the output ``output`` (pipeline/output/versions.py) whose zarr
    group holds ``denoised`` (n x d) and ``ids``/``labels`` when the input has them;
    the model comes from a verified run or a model folder.
    """
    from pipeline.runtime import activity

    with activity(
        "denoise"
    ):  # named if a worker stops answering (pipeline/runtime/liveness.py)
        return _denoise_to_store(
            model_path,
            input_cfg,
            output,
            chunks=chunks,
            method=method,
            overwrite=overwrite,
            storage_options=storage_options,
            ignore_extra=ignore_extra,
            keep_versions=keep_versions,
            retention_grace_hours=retention_grace_hours,
        )


def _denoise_config(model, method: str | None) -> DenoiseConfig:
    """The pre-image settings of a saved model (its parameters), with ``method``."""
    params = model.get_params()
    return DenoiseConfig(
        enabled=True,
        preimage=method or "auto",
        alpha=params["alpha"],
        sample_size=params["preimage_sample_size"],
        tol=params["preimage_tol"],
        max_iter=params["preimage_max_iter"],
    )


def _write_denoised(target: Location, den, status, src, attrs: dict) -> np.ndarray:
    """Write the denoised rows (and the rows' ids and labels) into a new output version,
    marked with ``attrs``; the counts of the fixed-point statuses (0 converged, 1 and 2
    not)."""
    from .transform import row_array_stores

    g = target.open_group("a")
    rows = int(src.X.chunks[0][0])
    z = _write(g, "denoised", den, rows)
    z.attrs["columns"] = list(src.columns)
    stores = [da.store(den, z, lock=False, compute=False), *row_array_stores(g, src, rows)]
    *_, st = compute(*stores, status, label="denoise")
    counts = np.bincount(np.asarray(st, dtype=np.int64), minlength=3)
    g.attrs.update(attrs)
    return counts


def _denoise_to_store(
    model_path, input_cfg, output, *, chunks, method, overwrite, storage_options, ignore_extra,
    keep_versions=None, retention_grace_hours=None,
) -> dict[str, Any]:  # fmt: skip
    from pipeline.output import check_transform_output, publish_output

    from .transform import open_transform, verify_transform_output

    t0 = time.perf_counter()
    if output.rstrip("/").endswith(".parquet"):
        raise DenoiseError(
            "denoised rows are written as zarr; give an output path that does not end in "
            ".parquet."
        )
    out, model, src = open_transform(  # columns by name (pipeline/embed/transform.py)
        model_path, input_cfg, output, chunks, overwrite, storage_options, ignore_extra
    )
    dcfg = _denoise_config(model, method)
    den, status, _ = denoise_rows(model, src.X, dcfg, where=model_path, training_data=False)
    counts_box: list = []

    def write(target: Location) -> None:
        attrs = {
            "kind": "kpca-dask-denoised",
            "model": model_path,
            "input": input_cfg.path,
            "method": model.preimage_ if dcfg.preimage == "auto" else dcfg.preimage,
            "status": "complete",
        }
        counts_box.append(_write_denoised(target, den, status, src, attrs))

    def verify(target: Location) -> None:
        n = int(src.X.shape[0])
        verify_transform_output(
            target, n_rows=n, n_components=None, parquet=False, array="denoised"
        )

    def recheck() -> None:  # under the lock: another writer may have published meanwhile
        check_transform_output(
            output,
            model_path=model_path,
            inputs=[input_cfg.path],
            overwrite=overwrite,
            storage_options=storage_options,
        )

    publish_output(
        output,
        write=write,
        verify=verify,
        recheck=recheck,
        storage_options=storage_options,
        keep=keep_versions,
        grace=None if retention_grace_hours is None else retention_grace_hours * 3600,
        record={
            "kind": "kpca-dask-denoised",
            "format": "zarr",
            "data": ".",
            "rows": int(src.X.shape[0]),
            "n_features": int(den.shape[1]),
            "model": model_path,
            "input": input_cfg.path,
        },
    )
    counts = counts_box[-1]
    return {
        "rows": int(src.X.shape[0]),
        "n_features": int(den.shape[1]),
        "output": output,
        "fixed_point_not_converged": int(counts[1] + counts[2]),
        "seconds": time.perf_counter() - t0,
    }
