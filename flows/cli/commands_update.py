"""``kpca update``: a new run (version n+1) from a published run and a batch of new rows
(pipeline/update/run.py, flows/update_flow.py; docs/update.md)."""

from __future__ import annotations

import argparse

from .console import prefect_line, say
from .fresh_output import discard_fresh_output, new_local_folder
from .overrides import cluster_overrides, storage_options_arg

__all__ = ["cmd_update"]


def cmd_update(args: argparse.Namespace) -> int:
    """A new run (version n+1) from a published run and a batch of new rows
    (pipeline/update/run.py; docs/update.md)."""
    from pipeline.runtime import show_progress
    from pipeline.update import update_config

    from ..update_flow import run_update_flow_or_plain

    cfg = update_config(
        args.run,
        args.new_data,
        args.output,
        policy=args.policy,
        overwrite=args.overwrite,
        storage_options=storage_options_arg(args) if args.storage_options else None,
        input_storage_options=(
            storage_options_arg(args, "input_storage_options")
            if args.input_storage_options
            else None
        ),
        unlabelled=args.unlabelled,
        no_ids=args.no_ids,
        ignore_extra=args.ignore_extra,
    )
    if args.keep_versions is not None:
        cfg.output.keep_versions = args.keep_versions
    cluster_overrides(cfg, args)
    if args.prefect:
        from ..runtime import check_prefect_api

        say(args, prefect_line(check_prefect_api()))
    fresh = new_local_folder(cfg.output.path)
    try:
        with show_progress(args.progress):
            summary = run_update_flow_or_plain(cfg, use_prefect=args.prefect)
    except Exception as exc:
        if fresh is not None:  # a refused or failed update leaves no half-written version
            discard_fresh_output(fresh, exc)
        raise
    upd = summary.manifest["update"]
    print(
        f"kpca: update v{upd['version']} -> {cfg.output.path}: {upd['action']} of "
        f"{upd['batch_rows']} new rows ({upd['n_rows']} rows in all) because {upd['reason']}"
    )
    for name, c in (upd.get("changes") or {}).items():
        state = "changed" if c["changed"] else "kept"
        print(f"  {name:<13} {state} ({c['base']} -> {c['new']}): {c['why']}")
    for f in upd.get("findings") or []:
        print(f"  finding       {f['check']}: {f['message']}")
    print(f"  drift report  {summary.out_version or cfg.output.path}/{upd['report']}")
    print(f"  inspect       kpca info {cfg.output.path}")
    return 0
