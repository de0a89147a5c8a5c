"""``kpca transform``: embed new rows with a saved model or run folder (or, with
``--inverse``, write their pre-images), on threads here or on a Dask cluster."""

from __future__ import annotations

import argparse

from pipeline.errors import UserError

from .overrides import storage_options_arg

__all__ = ["cmd_transform"]


def cmd_transform(args: argparse.Namespace) -> int:
    from pipeline.config import InputConfig, absolute_path
    from pipeline.runtime import show_progress

    if args.preimage != "auto" and not args.inverse:
        raise UserError("--preimage applies to --inverse only.")
    options = storage_options_arg(args)
    input_options = (
        storage_options_arg(args, "input_storage_options")
        if args.input_storage_options is not None
        else options
    )
    # recorded in the output's attributes: absolute, whatever folder this ran in
    args.model, args.input = absolute_path(args.model), absolute_path(args.input)
    inp = InputConfig(
        path=args.input,
        format=args.format,
        columns=args.columns.split(",") if args.columns else None,
        id_column=args.id_column,
        label_column=args.label_column,
        storage_options=input_options if "://" in args.input else {},
    )
    with _transform_cluster(args), show_progress(args.progress):
        return _transform(args, inp, options)


def _transform_cluster(args: argparse.Namespace):
    """``--cluster``: the scheduler to transform on (with the worker watch); without it
    the rows are embedded by threads in this process (nothing to probe)."""
    import contextlib

    if not args.cluster:
        return contextlib.nullcontext()
    from pipeline.config import ClusterConfig
    from pipeline.runtime import dask_client

    kw = {"address": args.cluster}
    if args.worker_timeout is not None:
        kw["worker_timeout"] = args.worker_timeout
    return dask_client(ClusterConfig(**kw))


def _transform(args: argparse.Namespace, inp, options: dict) -> int:
    from pipeline.config import ChunkConfig
    from pipeline.embed.transform import transform_to_store

    if args.inverse:
        from pipeline.embed.denoise import denoise_to_store

        res = denoise_to_store(
            args.model,
            inp,
            args.output,
            chunks=ChunkConfig(target_chunk_mb=args.chunk_mb),
            method=None if args.preimage == "auto" else args.preimage,
            overwrite=args.overwrite,
            storage_options=options,
            ignore_extra=args.ignore_extra,
            keep_versions=args.keep_versions,
            retention_grace_hours=args.retention_grace_hours,
        )
        late = res["fixed_point_not_converged"]
        print(
            f"kpca: denoised {res['rows']} rows ({res['n_features']} features) -> "
            f"{res['output']} ({res['seconds']:.1f} s)"
            + (
                f"; the fixed point fell back to the learned pre-image for {late} rows"
                if late
                else ""
            )
        )
        return 0
    res = transform_to_store(
        args.model,
        inp,
        args.output,
        chunks=ChunkConfig(target_chunk_mb=args.chunk_mb),
        overwrite=args.overwrite,
        storage_options=options,
        ignore_extra=args.ignore_extra,
        keep_versions=args.keep_versions,
        retention_grace_hours=args.retention_grace_hours,
    )
    print(
        f"kpca: embedded {res['rows']} rows into {res['components']} components -> "
        f"{res['output']} (version {res['version']}, {res['seconds']:.1f} s)"
    )
    return 0
