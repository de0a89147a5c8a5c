"""``kpca update``: each batch of new rows NEW_DATA names that the series has not merged,
published as a new version of RUN (pipeline/series/, pipeline/update/run.py,
flows/update_flow.py; docs/update.md)."""

from __future__ import annotations

import argparse

from .console import prefect_line, say
from .fresh_output import discard_fresh_output, new_local_folder
from .overrides import cluster_overrides, storage_options_arg

__all__ = ["cmd_update"]


def cmd_update(args: argparse.Namespace) -> int:
    """Every pending batch of NEW_DATA, oldest first, one version each (docs/update.md)."""
    from pipeline.runtime import show_progress
    from pipeline.series.night import parse_logical_date, run_night
    from pipeline.update import update_config

    from ..update_flow import run_update_flow_or_plain

    opts = storage_options_arg(args) if args.storage_options else None
    in_opts = (
        storage_options_arg(args, "input_storage_options")
        if args.input_storage_options
        else None
    )

    def make_config(base: str, batch: str, output: str | None):
        cfg = update_config(
            base,
            batch,
            output,
            policy=args.policy,
            overwrite=args.overwrite,
            storage_options=opts,
            input_storage_options=in_opts,
            unlabelled=args.unlabelled,
            no_ids=args.no_ids,
            ignore_extra=args.ignore_extra,
        )
        if args.keep_versions is not None:
            cfg.output.keep_versions = args.keep_versions
        if args.retention_grace_hours is not None:
            cfg.output.retention_grace_hours = args.retention_grace_hours
        if args.duplicate_ids is not None:
            cfg.update.duplicate_ids = args.duplicate_ids
        cluster_overrides(cfg, args)
        return cfg

    def run_one(cfg):
        fresh = new_local_folder(cfg.output.path)
        try:
            with show_progress(args.progress):
                summary = run_update_flow_or_plain(cfg, use_prefect=args.prefect)
        except Exception as exc:
            if fresh is not None:  # a refused or failed update leaves no half-written version
                discard_fresh_output(fresh, exc)
            raise
        _print_summary(cfg, summary)
        return summary

    if args.prefect:
        from ..runtime import check_prefect_api

        say(args, prefect_line(check_prefect_api()))
    night = run_night(
        args.run,
        args.new_data,
        make_config,
        run_one,
        output=args.output,
        storage_options=opts,
        input_storage_options=in_opts,
        logical_date=parse_logical_date(args.logical_date),
    )
    for path, vid in night.skipped:
        print(f"kpca: the batch {path} is already merged (version {vid}); nothing published")
    if not (night.merged or night.skipped or night.refused):
        print(f"kpca: no batch in {args.new_data}; nothing published")
    if night.refused and not night.merged and len(night.errors) == 1 and not night.skipped:
        raise night.errors[0]  # one batch: its own message and exit status
    for path, line in night.refused:
        print(f"kpca update: error: the batch {path} was refused: {line}")
    return 2 if night.refused else 0


def _print_summary(cfg, summary) -> None:
    upd = summary.manifest["update"]
    print(
        f"kpca: update v{upd['version']} -> {cfg.output.path}: {upd['action']} of "
        f"{upd['batch_rows']} new rows ({upd['n_rows']} rows in all) because {upd['reason']}"
        + (f" [version {summary.version}]" if summary.version else "")
    )
    print(f"  batch         {(upd.get('batch') or {}).get('path') or cfg.input.path}")
    for name, c in (upd.get("changes") or {}).items():
        state = "changed" if c["changed"] else "kept"
        print(f"  {name:<13} {state} ({c['base']} -> {c['new']}): {c['why']}")
    for f in upd.get("findings") or []:
        print(f"  finding       {f['check']}: {f['message']}")
    print(f"  drift report  {summary.out_version or cfg.output.path}/{upd['report']}")
    print(f"  inspect       kpca info {cfg.output.path}")
