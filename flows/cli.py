"""The ``kpca`` command line: a thin shell over the pipeline (and its Prefect flows).

    kpca demo [--output DIR]           the whole job on a built-in labelled dataset
    kpca run CONFIG [--output DIR]     the job a YAML config describes
    kpca validate CONFIG               the checks `kpca run` makes before anything starts
    kpca transform MODEL INPUT OUTPUT  embed new data with a saved model (or run folder)
    kpca info ARTIFACT_DIR             what a run produced, after verifying it
    kpca update RUN NEW_DATA           a new run from a published run and new rows
    kpca unlock OUTPUT_DIR             break the lock a dead run left on its output
    kpca --version

Global flags (-v/--verbose, -q/--quiet) go before or after the subcommand. ``kpca run``
first checks the config, the input (a sample of rows) and the output
(pipeline/validate.py), and only then starts Prefect and Dask: a wrong path, column or
type is one line per problem, in about a second, and leaves nothing behind.

Exit status by the error taxonomy (pipeline/errors.py): errors in the input, the
config or the artifacts print one line naming the problem and the fix and exit with 2
(nothing is published); a failure of the environment (I/O, network, lost workers) prints
one line and exits with 1 (re-running resumes); an unexpected exception is a bug: its
traceback is kept and the status is 70 (EX_SOFTWARE). Ctrl-C stops a run within a few
seconds with status 130 (re-running resumes from the finished stages).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import UserError, is_transient, is_user_error

EXIT_USAGE = 2  # the user can fix it: config, input, artifacts, output location
EXIT_FAILED = 1  # the environment failed (I/O, network, workers): re-run to resume
EXIT_BUG = 70  # an unexpected exception (sysexits.h EX_SOFTWARE): report it
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT): re-running resumes


# ------------------------------------------------------------------- commands
def _print_summary(summary, out: str) -> None:
    m = summary.manifest
    model = m["model"]
    inp = m["input"]
    print(f"\nkpca: run complete -> {out}")
    print(
        f"  input      {inp['n_rows']} rows x {inp['n_features']} features "
        f"({inp['source'].get('path')}), {inp['dropped_rows']} dropped"
    )
    print(
        f"  model      {model['solver']} solver, {model['n_components']} components, "
        f"kernel {model['kernel']}, {model['n_passes']} passes, "
        f"max residual {model['max_residual']:.1e}"
    )
    ev = m.get("evaluation") or {}
    if ev:
        shown = {k: v for k, v in ev.items() if isinstance(v, float)}
        print("  evaluation " + ", ".join(f"{k} {v:.3f}" for k, v in list(shown.items())[:6]))
    den = m.get("denoise") or {}
    if den:
        late = sum(den["fixed_point_not_converged"].values())
        print(
            f"  denoised   {den['rows']} rows ({den['selection']}) -> {den['array']}, "
            f"{den['method']} pre-image, mean squared change {den['mean_squared_change']:.3g}"
            + (f", {late} fixed-point fallbacks" if late else "")
        )
    print("  timings    " + ", ".join(f"{k} {v:.1f}s" for k, v in m["timings"].items()))
    states = getattr(summary, "states", None)
    if states:
        ran = [s for s, st in states.items() if st != "Cached"]
        print(
            f"  prefect    {len(states) - len(ran)} of {len(states)} stages cached; "
            + (f"ran {', '.join(ran)}" if ran else "nothing recomputed")
        )
    version = getattr(summary, "version", None)
    if version:
        print(f"  version    {version} (published; read it with pipeline.open_run({out!r}))")
    where = summary.out_version if version else out
    print(
        f"  artifacts  {out}/manifest.json; {where}/: model/, embedding, spectrum/"
        + (f", {den['array']}" if den else "")
        + (", embedding.parquet" if m["config"]["output"]["parquet"] else "")
        + (", report/report.md" if "report/report.md" in m.get("file_checksums", {}) else "")
    )
    print(f"  inspect    kpca info {out}")


def prestart_checks(cfg, command: str) -> None:
    """The pre-start checks (pipeline/validate.py): raise one error listing every problem
    before Prefect or Dask start and before anything is written; log the notes."""
    from pipeline.validate import validate

    v = validate(cfg)
    for note in v.notes:
        logging.getLogger("pipeline").info("%s: %s", command, note.message)
    v.raise_for_errors()


def _run_config(cfg, args: argparse.Namespace) -> Any:
    """The ``kpca_pipeline`` flow (or, with --no-prefect, the plain stages); either one
    connects to cfg.cluster itself. The input and output are checked first."""
    prestart_checks(cfg, args.command)
    start_runtime(args)
    from pipeline.progress import show_progress

    from .pipeline_flow import run_flow_or_plain
    from .runtime import handle_interrupts

    if args.prefect:
        from pipeline.run import check_begin

        from .runtime import check_prefect_api

        if check_prefect_api() == "ephemeral":  # checked before anything is written
            # the temporary server lives for this command only: no telemetry from it
            os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        # refuse a locked output, or a complete run without overwrite, now, not after
        # starting a Prefect server (writing nothing: the flow may still refuse the run,
        # e.g. workers that cannot see it)
        check_begin(cfg)
    fresh = _new_local_folder(cfg.output.path)
    try:
        with handle_interrupts(lambda: _interrupt_line(args)), show_progress(args.progress):
            return run_flow_or_plain(cfg, use_prefect=args.prefect)
    except Exception as exc:
        if fresh is not None:
            _discard_fresh_output(fresh, exc)
        raise


def _new_local_folder(path: str) -> Path | None:
    """The output folder when it is local and does not exist yet (else None)."""
    if "://" in path and not path.startswith("file://"):
        return None
    p = Path(path.removeprefix("file://"))
    return None if p.exists() or p.is_symlink() else p


def _discard_fresh_output(folder: Path, exc: Exception) -> None:
    """After a failed run, remove the output folder this command created when nothing in it
    is worth keeping: a user error (bad input found by ingest: the input must change, so
    nothing would be resumed) or nothing written at all. Other failures keep the folder:
    re-running resumes from it. Only a folder holding nothing but a run's own names goes,
    through the project's one deletion function."""
    from pipeline.layout import MANIFEST, RUN_NAMES

    if not folder.is_dir():
        return
    names = {p.name for p in folder.iterdir()}
    if not names:
        _rmdir(folder)
        return
    from kpca_dask.removal import MARKER_FILE

    if not is_user_error(exc) or MANIFEST in names or not names <= RUN_NAMES | {MARKER_FILE}:
        return
    from kpca_dask.removal import remove_owned

    try:
        remove_owned(folder, root=folder, owned=lambda p: p == folder)
    except Exception:  # noqa: BLE001 - a folder we cannot remove safely stays, as it was
        logging.getLogger("pipeline").warning("kept %s (could not remove it safely)", folder)


def _rmdir(folder: Path) -> None:
    """Remove an empty folder (rmdir never removes one that holds anything)."""
    try:
        folder.rmdir()
    except OSError:
        pass


def _load_run_config(args: argparse.Namespace):
    from pipeline.config import load_config

    cfg = load_config(args.config)
    if args.output:
        cfg.output.path = args.output
    if args.overwrite:
        cfg.output.overwrite = True
    if getattr(args, "keep_versions", None) is not None:
        cfg.output.keep_versions = args.keep_versions
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _load_run_config(args)
    summary = _run_config(cfg, args)
    _print_summary(summary, cfg.output.path)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from pipeline.validate import validate

    cfg = _load_run_config(args)
    v = validate(cfg)
    for f in v.notes:
        print(f"kpca validate: note: {f.message}", file=sys.stderr)
    if not v.ok:
        for f in v.errors:
            print(f"kpca validate: error: {f.message}", file=sys.stderr)
        return EXIT_USAGE
    print(f"kpca validate: ok: {v.summary(cfg)}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.config import load_config
    from pipeline.demo_data import DEMO_DATASETS, write_demo_dataset

    out = Path(args.output).resolve()
    data_dir = out.parent / (out.name + "-data")
    path = write_demo_dataset(data_dir)
    demo = DEMO_DATASETS["digits"]
    print(f"kpca demo: {demo.description}; written to {path}")
    cfg = load_config(
        {
            "input": {
                "path": str(path),
                "label_column": demo.label_column,
                "id_column": demo.id_column,
            },
            "kernel": demo.kernel,
            "preprocess": {"scale": demo.scale},  # the gamma is tuned on raw pixels
            "solver": {"n_components": demo.n_components, "random_state": 0},
            # small chunks on purpose: the demo shows chunked ingest and a blocked kernel
            "chunks": {"target_chunk_mb": 0.2, "block_rows": 256},
            "output": {"path": str(out), "overwrite": True},
            "evaluate": {"enabled": True},
            # and kernel PCA denoising of the held-out digits (docs/denoise.md)
            "denoise": {"enabled": True, "rows": "held_out"},
        }
    )
    summary = _run_config(cfg, args)
    _print_summary(summary, str(out))
    return 0


def _storage_options(args: argparse.Namespace, flag: str = "storage_options") -> dict:
    """A command's ``--storage-options`` (JSON or a YAML file; credentials refused)."""
    from pipeline.config import parse_storage_options

    return parse_storage_options(getattr(args, flag, None), "--" + flag.replace("_", "-"))


def cmd_transform(args: argparse.Namespace) -> int:
    from pipeline.config import ChunkConfig, InputConfig
    from pipeline.progress import show_progress
    from pipeline.transform import transform_to_store

    options = _storage_options(args)
    input_options = (
        _storage_options(args, "input_storage_options")
        if args.input_storage_options is not None
        else options
    )
    inp = InputConfig(
        path=args.input,
        format=args.format,
        columns=args.columns.split(",") if args.columns else None,
        id_column=args.id_column,
        label_column=args.label_column,
        storage_options=input_options if "://" in args.input else {},
    )
    if args.inverse:
        from pipeline.denoise import denoise_to_store

        with show_progress(args.progress):
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
    if args.preimage != "auto":
        raise UserError("--preimage applies to --inverse only.")
    with show_progress(args.progress):
        res = transform_to_store(
            args.model,
            inp,
            args.output,
            chunks=ChunkConfig(target_chunk_mb=args.chunk_mb),
            overwrite=args.overwrite,
            storage_options=options,
            ignore_extra=args.ignore_extra,
            keep_versions=args.keep_versions,
        )
    print(
        f"kpca: embedded {res['rows']} rows into {res['components']} components -> "
        f"{res['output']} (version {res['version']}, {res['seconds']:.1f} s)"
    )
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from pipeline.export import open_run
    from pipeline.store import Location

    run = open_run(
        Location.at(args.artifact_dir, _storage_options(args)),
        version=args.version,
        check_arrays=not args.no_verify,
    )
    m, out = run.manifest, run.location
    if args.json:
        print(json.dumps(m if run.pointer is None or args.version else run.pointer, indent=2))
        return 0
    g = out.open_group("r")
    ev = np.asarray(g["spectrum/eigenvalues"][...])
    evr = np.asarray(g["spectrum/explained_variance_ratio"][...])
    res = np.asarray(g["spectrum/residuals"][...])
    inp, model = m["input"], m["model"]
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
    for line in _feature_lines(inp.get("features"), inp.get("columns") or []):
        print(line)
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
    print(f"residuals  max {res.max():.1e}  (||Kc v - lambda v|| / lambda)")
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
    ks = m.get("kernel_store") or {}
    if ks:
        print(
            f"kernel     {'materialised' if ks.get('materialized') else 'recomputed per pass'}"
            f" ({ks.get('reason')})"
        )
    print(
        f"files      model/, embedding ({upd.get('n_rows', inp['n_rows'])} x {len(ev)}), "
        "spectrum/"
        + (", embedding.parquet" if out.child("embedding.parquet").exists() else "")
        + (", report/" if out.child("report").exists() else "")
    )
    return 0


def _feature_lines(block: dict | None, columns: list[str], limit: int = 24) -> list[str]:
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


def cmd_update(args: argparse.Namespace) -> int:
    """A new run (version n+1) from a published run and a batch of new rows
    (pipeline/update.py; docs/update.md)."""
    from pipeline.progress import show_progress
    from pipeline.update import update_config

    from .update_flow import run_update_flow_or_plain

    cfg = update_config(
        args.run,
        args.new_data,
        args.output,
        policy=args.policy,
        overwrite=args.overwrite,
        storage_options=_storage_options(args) if args.storage_options else None,
        input_storage_options=(
            _storage_options(args, "input_storage_options")
            if args.input_storage_options
            else None
        ),
    )
    if args.keep_versions is not None:
        cfg.output.keep_versions = args.keep_versions
    with show_progress(args.progress):
        summary = run_update_flow_or_plain(cfg, use_prefect=args.prefect)
    upd = summary.manifest["update"]
    print(
        f"kpca: update v{upd['version']} -> {cfg.output.path}: {upd['action']} of "
        f"{upd['batch_rows']} new rows ({upd['n_rows']} rows in all) because {upd['reason']}"
    )
    print(f"  drift report  {summary.out_version or cfg.output.path}/{upd['report']}")
    print(f"  inspect       kpca info {cfg.output.path}")
    return 0


def cmd_unlock(args: argparse.Namespace) -> int:
    from pipeline.lock import break_lock
    from pipeline.store import Location

    holder = break_lock(Location.at(args.output_dir, _storage_options(args)))
    if holder is None:
        print(f"kpca: {args.output_dir} was not locked")
    else:
        print(f"kpca: removed the lock of {args.output_dir} ({holder.describe()})")
    return 0


_DISK_FULL = {"ENOSPC", "EDQUOT", "EFBIG"}


def _disk_full(exc: BaseException) -> str | None:
    """One line for a full disk / exceeded quota / file size limit, else None."""
    import errno

    if isinstance(exc, OSError) and errno.errorcode.get(exc.errno or -1) in _DISK_FULL:
        where = f" writing {exc.filename}" if exc.filename else ""
        return (
            f"out of disk space{where} ({exc.strerror or exc}); free space or set "
            "output.path to a bigger disk, then re-run the same command to resume."
        )
    return None


def _environment_error(exc: BaseException) -> str | None:
    """One line for a failure of the machine or cluster rather than of the code: a full
    disk, or workers that kept dying on one task (out of memory, as a rule). None: a bug."""
    line = _disk_full(exc)
    if line is None and isinstance(exc, OSError) and exc.errno == 30:  # EROFS
        where = f" {exc.filename}" if exc.filename else ""
        line = (
            f"cannot write{where}: the file system is read-only; set output.path (or "
            "--output) to a writable folder."
        )
    if line is None and type(exc).__name__ == "KilledWorker":
        from dask.utils import key_split

        task = key_split(exc.args[0]) if exc.args else "?"
        tries = exc.args[2] + 1 if len(exc.args) > 2 else "several"
        line = (
            f"{tries} workers died running a {task!r} task (out of memory, as a rule); "
            "give the workers more memory (cluster.memory_limit) or use smaller chunks "
            "(chunks.block_rows, chunks.target_chunk_mb), then re-run the same command to "
            "resume."
        )
    return line


# ------------------------------------------------------------------------ main
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kpca-dask")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        from kpca_dask import __version__

        return __version__


def _global_flags(p: argparse.ArgumentParser, sub: bool = False) -> None:
    """-v/-q, accepted before the subcommand and after it (``kpca -v run`` and
    ``kpca run c.yaml -v``): a subcommand's own copies count into the same totals."""
    suffix = "_sub" if sub else ""
    p.add_argument(
        "-v",
        "--verbose",
        dest="verbose" + suffix,
        action="count",
        default=0,
        help="more logging (-v: stages and passes, -vv: debug)",
    )
    p.add_argument(
        "-q",
        "--quiet",
        dest="quiet" + suffix,
        action="store_true",
        default=False,
        help="warnings and errors only (no stage log, no progress bars)",
    )


def _storage_flags(sp: argparse.ArgumentParser, what: str) -> None:
    sp.add_argument(
        "--storage-options",
        metavar="JSON|FILE",
        help=f"fsspec options of {what} when it is a URL, as a JSON object or a small "
        'YAML/JSON file, e.g. \'{"client_kwargs": {"endpoint_url": "http://..."}}\' '
        "(credentials are refused: they come from the environment)",
    )


def _progress_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="show progress bars (default: when stderr is a terminal)",
    )
    sp.add_argument("--no-progress", dest="progress", action="store_false")


def _prefect_flags(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--no-prefect",
        dest="prefect",
        action="store_false",
        default=True,
        help="run the stages without Prefect (no run record, no task cache, "
        "no temporary API server; default: the kpca_pipeline flow, "
        "against PREFECT_API_URL or an ephemeral local API)",
    )


def _subcommand(sub, name: str, func, **kw) -> argparse.ArgumentParser:
    sp = sub.add_parser(name, **kw)
    _global_flags(sp, sub=True)
    sp.set_defaults(func=func)
    return sp


# one function per subcommand: each one's arguments in one place
def _add_demo(sub) -> None:
    d = _subcommand(sub, "demo", cmd_demo, help="run the whole job on a built-in dataset")
    d.add_argument(
        "--output",
        default="kpca-demo-output",
        help="artifact folder (default: ./kpca-demo-output)",
    )
    _progress_flags(d)
    _prefect_flags(d)


def _keep_flag(p) -> None:
    p.add_argument(
        "--keep-versions",
        type=int,
        metavar="N",
        help="how many published versions of the output to keep, the new one included "
        "(default: output.keep_versions, 7); older ones are deleted once it is published",
    )


def _add_run(sub) -> None:
    r = _subcommand(sub, "run", cmd_run, help="run the job a YAML config describes")
    r.add_argument("config", help="YAML config (see docs/config.md)")
    r.add_argument("--output", help="override output.path")
    r.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a complete run there "
        "(with the flow: only the stages whose inputs changed run again)",
    )
    _keep_flag(r)
    _progress_flags(r)
    _prefect_flags(r)


def _add_validate(sub) -> None:
    c = _subcommand(
        sub,
        "validate",
        cmd_validate,
        help="check a config, its input and its output before running it",
        description="The checks `kpca run` makes before it starts Prefect or Dask: the "
        "input exists and is readable, the columns and label are there, the types and "
        "the NaN policy hold on a sample of rows, the output is writable (nothing is "
        "left behind), and whether a complete run is already there. One line per "
        "problem; exit status 2 when there is one.",
    )
    c.add_argument("config", help="YAML config (see docs/config.md)")
    c.add_argument("--output", help="override output.path")
    c.add_argument("--overwrite", action="store_true", help="as `kpca run --overwrite`")


def _add_transform(sub) -> None:
    t = _subcommand(
        sub, "transform", cmd_transform, help="embed new data with a saved model or run folder"
    )
    t.add_argument("model", help="run folder (verified) or model folder")
    t.add_argument("input", help="NPY, CSV, Parquet or zarr input (path or URL)")
    t.add_argument("output", help="output zarr folder, or a path ending in .parquet")
    t.add_argument(
        "--format", default="auto", choices=["auto", "npy", "csv", "parquet", "zarr"]
    )
    t.add_argument(
        "--columns",
        help="comma-separated feature columns (tabular input; default: the model's "
        "features, matched by name in any order)",
    )
    t.add_argument("--id-column", help="row id column to carry (default: the run's)")
    t.add_argument("--label-column", help="label column to carry (default: the run's)")
    t.add_argument(
        "--ignore-extra",
        action="store_true",
        help="embed with the model's features even when the table has other columns "
        "(by default refused when the run took every column as a feature)",
    )
    t.add_argument("--chunk-mb", type=float, default=64.0)
    t.add_argument("--overwrite", action="store_true")
    _keep_flag(t)
    t.add_argument(
        "--inverse",
        action="store_true",
        help="denoise: write the pre-images of the rows' embedding (zarr array "
        "'denoised'); needs a model fitted with denoise.enabled / "
        "fit_inverse_transform=True",
    )
    t.add_argument(
        "--preimage",
        choices=["auto", "learned", "fixed_point", "exact"],
        default="auto",
        help="with --inverse: the pre-image method (default: the model's)",
    )
    _storage_flags(t, "the model and the output (and the input, unless given below)")
    t.add_argument(
        "--input-storage-options",
        metavar="JSON|FILE",
        help="fsspec options of the input URL when they differ from --storage-options",
    )
    _progress_flags(t)


def _add_info(sub) -> None:
    i = _subcommand(sub, "info", cmd_info, help="verify a run folder and summarise it")
    i.add_argument("artifact_dir")
    i.add_argument("--json", action="store_true", help="print the manifest")
    i.add_argument("--no-verify", action="store_true", help="skip the array checksums")
    i.add_argument(
        "--version",
        metavar="ID",
        help="read an earlier published version (one of those `kpca info --json` lists "
        "under history) instead of the published one",
    )
    _storage_flags(i, "the run folder")


def _add_update(sub) -> None:
    up = _subcommand(
        sub,
        "update",
        cmd_update,
        help="a new run from a published run and new rows (docs/update.md)",
    )
    up.add_argument("run", help="the published run to start from (never modified)")
    up.add_argument("new_data", help="the batch of new rows (same columns as the run's input)")
    up.add_argument("--output", help="the new run's folder (default: RUN-v<n+1> beside RUN)")
    up.add_argument(
        "--policy",
        choices=["auto", "merge", "refresh_landmarks", "refit"],
        help="override update.policy of the run's config",
    )
    up.add_argument("--overwrite", action="store_true", help="replace a complete run there")
    _keep_flag(up)
    _storage_flags(up, "the base run and the new run (default for the new run: the base's)")
    up.add_argument(
        "--input-storage-options",
        metavar="JSON|FILE",
        help="fsspec options of NEW_DATA's URL (default: the base run's input options)",
    )
    _progress_flags(up)
    _prefect_flags(up)


def _add_unlock(sub) -> None:
    u = _subcommand(
        sub, "unlock", cmd_unlock, help="break the lock a dead run left on an output folder"
    )
    u.add_argument("output_dir")
    _storage_flags(u, "the output folder")


SUBCOMMANDS = [
    _add_demo,
    _add_run,
    _add_validate,
    _add_transform,
    _add_info,
    _add_update,
    _add_unlock,
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kpca", description="Distributed, out-of-core kernel PCA.")
    p.add_argument("--version", action="version", version=f"kpca-dask {_version()}")
    _global_flags(p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the global flags merged from wherever they were given."""
    args = build_parser().parse_args(argv)
    args.verbose = args.verbose + getattr(args, "verbose_sub", 0)
    args.quiet = args.quiet or getattr(args, "quiet_sub", False)
    if args.quiet and getattr(args, "progress", None) is None:
        args.progress = False
    return args


def _setup_logging(args: argparse.Namespace) -> None:
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    if args.command in ("demo", "run", "update") and args.verbose == 0 and not args.quiet:
        level = logging.INFO
    logging.basicConfig(
        level=level, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S"
    )
    quiet_storage_sdks(args.verbose)


#: loggers of the object-store clients: the Azure SDK logs every request's headers at INFO
#: (azure.core.pipeline.policies.http_logging_policy), thousands of lines for one run
STORAGE_LOGGERS = (
    "azure",
    "adlfs",
    "gcsfs",
    "google",
    "google_auth_httplib2",
    "s3fs",
    "botocore",
    "aiobotocore",
    "boto3",
    "urllib3",
    "aiohttp",
    "fsspec",
)


def quiet_storage_sdks(verbose: int = 0) -> None:
    """Storage SDK logging: warnings only at the default level, their INFO at -v, their
    DEBUG at -vv."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    for name in STORAGE_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if verbose == 0:  # their retry tracebacks repeat the command's one error line
            logger.addFilter(_without_traceback)


def _without_traceback(record: logging.LogRecord) -> bool:
    record.exc_info = None
    record.exc_text = None
    return True


def start_runtime(args: argparse.Namespace) -> None:
    """Import (and quieten) Dask and, for a flow, Prefect: called by a command once its
    cheap checks passed, so that a wrong path is reported before any of this starts."""
    import distributed  # noqa: F401  (configures its loggers on import; quieten them after)

    if getattr(args, "prefect", False):
        from .runtime import quiet_prefect

        quiet_prefect()
    for noisy in ("distributed", "prefect", "httpx", "asyncio", "tornado"):
        logging.getLogger(noisy).setLevel(
            logging.DEBUG if args.verbose >= 2 else logging.WARNING
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _setup_logging(args)
    args.t0 = time.perf_counter()
    try:
        if args.command not in ("run", "demo", "validate"):  # those start it themselves
            start_runtime(args)
        return args.func(args)
    except KeyboardInterrupt:
        return _interrupted(args)
    except Exception as exc:  # noqa: BLE001 - classified by the taxonomy, bugs re-shown
        from .runtime import interrupted

        if interrupted():  # Prefect reports the interrupted flow as its own exception
            return _interrupted(args)
        return _report_error(args.command, exc)


def _interrupt_line(args: argparse.Namespace) -> str:
    kept = " (finished stages are kept)" if args.command in ("run", "demo") else ""
    return (
        f"kpca {args.command}: interrupted after {time.perf_counter() - args.t0:.0f} s{kept}; "
        "re-run the same command to resume."
    )


def _interrupted(args: argparse.Namespace) -> int:
    from .runtime import report_interrupt

    if os.environ.get("KPCA_DEBUG_INTERRUPT"):
        from .runtime import _INTERRUPT

        at = _INTERRUPT["at"]
        print(f"unwound in {time.monotonic() - at if at else -1:.2f} s", file=sys.stderr)

    report_interrupt(_interrupt_line(args))
    return EXIT_INTERRUPTED


def _user_message(exc: BaseException) -> str:
    """The error's message; pydantic's (a parameter given on the command line) in the
    config's words: the field and the problem, without pydantic's URLs."""
    from pydantic import ValidationError

    from pipeline.config import format_validation_error

    if isinstance(exc, ValidationError):
        return format_validation_error(exc, "the command-line arguments")
    if type(exc).__name__ == "NoCredentialsError":  # botocore: no credentials anywhere
        return (
            f"{exc}: the object store needs credentials; set them in the environment "
            "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) or give the "
            'pods an identity, or pass {"anon": true} in the storage options of a public '
            "bucket."
        )
    return str(exc)


def _report_error(command: str, exc: Exception) -> int:
    """Print what went wrong as the taxonomy says (pipeline/errors.py); the exit status."""
    findings = getattr(exc, "findings", None)
    if findings and is_user_error(exc):  # the pre-start checks: one line per problem
        for f in findings:
            print(f"kpca {command}: error: {f.message}", file=sys.stderr)
        return EXIT_USAGE
    if is_user_error(exc):
        msg = _user_message(exc).strip().splitlines()
        print(
            f"kpca {command}: error: {msg[0] if msg else type(exc).__name__}", file=sys.stderr
        )
        for line in msg[1:]:
            print(f"  {line}", file=sys.stderr)
        return EXIT_USAGE
    line = _environment_error(exc)
    if line is not None:  # the machine or cluster, with a fix to name
        print(f"kpca {command}: error: {line}", file=sys.stderr)
        return EXIT_USAGE
    if is_transient(exc):
        endpoint = (
            "; an object store's endpoint goes in storage_options (or --storage-options): "
            '{"client_kwargs": {"endpoint_url": ...}}'
            if "endpoint" in str(exc).lower()
            else ""
        )
        print(
            f"kpca {command}: error: {type(exc).__name__}: {exc} (I/O, network or lost "
            f"workers){endpoint}; re-run the same command to resume.",
            file=sys.stderr,
        )
        return EXIT_FAILED
    import traceback

    traceback.print_exception(exc, file=sys.stderr)
    print(
        f"kpca {command}: internal error ({type(exc).__name__}): a bug in kpca-dask, not "
        "in your input; please report it with the traceback above.",
        file=sys.stderr,
    )
    return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
