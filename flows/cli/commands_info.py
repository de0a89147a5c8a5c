"""``kpca info``: verify a run folder (pipeline.output.export.open_run) and summarise it, or
print
its manifest (``--json``)."""

from __future__ import annotations

import argparse
import json

import numpy as np

from .overrides import storage_options_arg

__all__ = ["cmd_info", "feature_lines"]


def cmd_info(args: argparse.Namespace) -> int:
    from pipeline.output import Location, open_run, read_spectrum

    run = open_run(
        Location.at(args.artifact_dir, storage_options_arg(args)),
        version=args.version,
        check_arrays=not args.no_verify,
    )
    m = run.manifest
    if args.json:
        print(json.dumps(m if run.pointer is None or args.version else run.pointer, indent=2))
        return 0
    spectrum = read_spectrum(run.location)
    _print_run(args, run)
    _print_fit(m, spectrum)
    _print_record(m)
    _print_files(run, len(spectrum["eigenvalues"]))
    return 0


def _print_run(args: argparse.Namespace, run) -> None:
    """Where the run is, which version, when and with what it was made, and its input."""
    m = run.manifest
    inp = m["input"]
    skipped = " (skipped)" if args.no_verify else ""
    print(f"run        {args.artifact_dir}  [{m['status']}, verified{skipped}]")
    if run.version is not None:
        published = run.pointer.get("version")
        kept = len(run.history)
        print(
            f"version    {run.version}"
            + (" (published)" if run.version == published else f" (published: {published})")
            + f"; {kept} version{'s' if kept != 1 else ''} kept"
        )
    print(
        f"created    {m['created']} with kpca-dask {m['packages'].get('kpca-dask', '?')}, "
        f"dask {m['packages'].get('dask', '?')}, zarr {m['packages'].get('zarr', '?')}"
    )
    print(
        f"input      {inp['source'].get('path')}: {inp['n_rows']} rows x {inp['n_features']} "
        f"features, {inp['dropped_rows']} dropped; fingerprint {inp['fingerprint']}"
    )
    if inp.get("label_column"):
        print(f"labels     column {inp['label_column']!r}: {len(inp['classes'])} classes")
    for line in feature_lines(inp.get("features"), inp.get("columns") or []):
        print(line)


def _print_fit(m: dict, spectrum: dict[str, np.ndarray]) -> None:
    """The model, its scaling and its spectrum."""
    model = m["model"]
    ev, evr = spectrum["eigenvalues"], spectrum["explained_variance_ratio"]
    print(
        f"model      {model['solver']} solver, kernel {model['kernel']}, "
        f"{model['n_components']} components, {model['n_passes']} passes"
    )
    if model.get("preprocess") == "none":
        print("scaling    none (the raw feature values; preprocess.scale)")
    elif model.get("preprocess"):
        print(f"scaling    {model['preprocess']} (fitted on the training rows, in the model)")
    cum = np.cumsum(evr)
    print(
        "spectrum   " + "  ".join(f"{v:.4g}" for v in ev[:8]) + (" ..." if len(ev) > 8 else "")
    )
    print(
        f"explained  {100 * cum[-1]:.1f}% of the feature-space variance "
        f"by {len(ev)} components "
        f"(first: {100 * evr[0]:.1f}%)"
    )
    print(f"residuals  max {spectrum['residuals'].max():.1e}  (||Kc v - lambda v|| / lambda)")


def _print_record(m: dict) -> None:
    """What the run did: timings, evaluation, the update it was, the kernel's storage."""
    print("timings    " + ", ".join(f"{k} {v:.1f}s" for k, v in m["timings"].items()))
    ev_sum = m.get("evaluation")
    if ev_sum:
        print(
            "evaluation "
            + ", ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                for k, v in ev_sum.items()
            )
        )
    upd = m.get("update") or {}
    if upd:
        print(
            f"update     v{upd['version']} from {upd['base']}: {upd['action']} of "
            f"{upd['batch_rows']} rows ({upd['n_rows']} in all); {upd['reason']}"
        )
        for name, c in (upd.get("changes") or {}).items():
            print(
                f"           {name} {'CHANGED' if c['changed'] else 'kept'} "
                f"({c['base']} -> {c['new']}): {c['why']}"
            )
        for f in upd.get("findings") or []:
            print(f"finding    {f['check']}: {f['message']}")
    ks = m.get("kernel_store") or {}
    if ks:
        print(
            f"kernel     {'materialised' if ks.get('materialized') else 'recomputed per pass'}"
            f" ({ks.get('reason')})"
        )


def _print_files(run, n_components: int) -> None:
    """The run's files (the optional ones when they are there)."""
    from pipeline.output import PARQUET, REPORT

    m = run.manifest
    rows = (m.get("update") or {}).get("n_rows", m["input"]["n_rows"])
    print(
        f"files      model/, embedding ({rows} x {n_components}), "
        "spectrum/"
        + (", embedding.parquet" if run.child(PARQUET).exists() else "")
        + (", report/" if run.child(REPORT).exists() else "")
    )


def feature_lines(block: dict | None, columns: list[str], limit: int = 24) -> list[str]:
    """``kpca info``'s lines on the features a run used (its manifest's features block;
    a run written before the block existed: the column names only)."""
    block = block or {"names": columns, "dtypes": None, "selection": None}
    names, dtypes = list(block.get("names") or []), block.get("dtypes")
    how = {
        "columns": "listed in input.columns",
        "all": "every column but the id/label"
        + (" and input.exclude_columns" if block.get("excluded") else ""),
        "positions": "no names: columns by position",
    }.get(block.get("selection"), "")
    if dtypes and len(set(dtypes)) == 1:
        how += f"{', ' if how else ''}all {dtypes[0]}"
        items = list(names)
    elif dtypes:
        items = [f"{n} ({t})" for n, t in zip(names, dtypes)]
    else:
        items = list(names)
    shown = items[:limit]
    if len(items) > limit:
        shown.append(f"... ({len(items) - limit} more: kpca info --json lists all)")
    lines, line = [], f"features   {len(names)}" + (f" ({how})" if how else "") + ":"
    for k, item in enumerate(shown):
        piece = f" {item}" + ("," if k < len(shown) - 1 else "")
        if len(line) + len(piece) > 100:
            lines.append(line)
            line = " " * 10
        line += piece
    lines.append(line)
    notes = []
    if block.get("bool_columns"):
        notes.append(f"bool as 0/1: {', '.join(block['bool_columns'])}")
    if block.get("id_column"):
        notes.append(f"id column {block['id_column']!r}")
    if block.get("excluded"):
        notes.append(f"excluded: {', '.join(block['excluded'])}")
    left_out = [
        f"{c['name']} ({c['dtype']})" if isinstance(c, dict) else str(c)
        for c in block.get("ignored") or []
    ]
    if left_out:
        notes.append(f"left out (not numeric): {', '.join(left_out)}")
    if notes:
        lines.append(" " * 11 + "; ".join(notes))
    return lines
