"""The ``kpca_transform`` flow: embed a new batch with a saved model, on a Dask cluster.

Parameters are the pipeline's own config sections (the Prefect UI renders
them as forms): ``input`` describes the batch exactly as a run's input does,
``chunks`` how it is read, ``cluster`` where it runs. ``model`` is a run
folder (its manifest and checksums are verified first) or a model folder;
``storage_options`` are the fsspec options of ``model`` and ``output`` when they are
object-store URLs (the input has its own).
The output is a zarr group (``embedding``, plus ``ids``/``labels`` when the
input has them) or, for a path ending in ``.parquet``, a Parquet dataset.

The task is not cached: a transform is asked for on demand, for a batch
that may have changed in place. It retries transient failures only.
"""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow, get_run_logger
from pydantic import AfterValidator

from pipeline.config import ChunkConfig, ClusterConfig, InputConfig, check_storage_options
from pipeline.output import check_transform_output
from pipeline.runtime import dask_client

from . import tasks
from .artifacts import publish_transform_artifacts
from .runtime import dashboard_line, forward_library_logs

__all__ = ["StorageOptions", "kpca_transform"]

#: fsspec options as a flow parameter: refused when they hold credentials (when a run is
#: created, by Prefect's parameter validation, as a config file's are by the config model)
StorageOptions = Annotated[dict[str, Any], AfterValidator(check_storage_options)]


@flow(
    name="kpca-transform",
    validate_parameters=True,
    persist_result=False,  # nothing of a transform is kept by Prefect (see tasks.transform)
    description="Embed a new batch of rows with a saved kernel PCA model.",
)
def kpca_transform(
    model: str,
    input: InputConfig,
    output: str,
    chunks: ChunkConfig | None = None,
    cluster: ClusterConfig | None = None,
    overwrite: bool = False,
    storage_options: StorageOptions | None = None,
) -> dict[str, Any]:
    """Embed ``input`` with ``model`` into ``output``; returns rows, components, seconds.

    ``storage_options``: fsspec options of the model's and the output's URLs (an
    endpoint, a region; credentials are refused: the environment or the cloud identity
    provides them); the input carries its own, ``input.storage_options``.
    """
    log = get_run_logger()
    opts = dict(storage_options or {})
    # before any cluster starts: "", ".", the input, a run folder, a path kpca did not write
    check_transform_output(
        output,
        model_path=model,
        inputs=[input.path],
        overwrite=overwrite,
        storage_options=opts,
    )
    with forward_library_logs(), dask_client(cluster or ClusterConfig()) as client:
        log.info(dashboard_line(client))
        res = tasks.transform(
            model=model,
            input=input,
            output=output,
            chunks=chunks or ChunkConfig(),
            overwrite=overwrite,
            storage_options=opts,
        )
    log.info(
        "embedded %d rows of %s into %d components -> %s",
        res["rows"],
        input.path,
        res["components"],
        output,
    )
    res["artifacts"] = publish_transform_artifacts(model, input.path, res)
    return res
