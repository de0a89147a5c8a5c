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
first checks the config, the input (every row, streaming) and the output
(pipeline/validate.py), and only then starts Prefect and Dask: a wrong path, column or
type is one line per problem, in about a second, and leaves nothing behind.

Exit status by the error taxonomy (pipeline/errors.py): errors in the input, the
config or the artifacts print one line naming the problem and the fix and exit with 2
(nothing is published); a failure of the environment (I/O, network, lost workers) prints
one line and exits with 1 (re-running resumes); an unexpected exception is a bug: its
traceback is kept and the status is 70 (EX_SOFTWARE). Ctrl-C (SIGINT) stops a run within a
few seconds with status 130, SIGTERM (a scheduler, Kubernetes, systemd) likewise with 143:
one line, every process the command started (the local Dask workers, a temporary Prefect
server) stopped, and re-running resumes from the finished stages.
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
EXIT_TERMINATED = 143  # SIGTERM (128 + SIGTERM), handled as Ctrl-C


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
    if args.prefect:  # importing Prefect and Dask takes seconds: say what is under way
        _say(args, "input and output checked; loading Prefect")
    start_runtime(args)
    from pipeline.progress import show_progress

    from .pipeline_flow import run_flow_or_plain
    from .runtime import handle_interrupts

    if args.prefect:
        from pipeline.run import check_begin

        from .runtime import check_prefect_api

        mode = check_prefect_api()  # checked before anything is written
        _say(args, _prefect_line(mode))
        # refuse a locked output, or a complete run without overwrite, now, not after
        # starting a Prefect server (writing nothing: the flow may still refuse the run,
        # e.g. workers that cannot see it)
        check_begin(cfg)
    else:
        _say(args, "starting the stages without Prefect")
    fresh = _new_local_folder(cfg.output.path)
    try:
        with handle_interrupts(lambda: _interrupt_line(args)), show_progress(args.progress):
            return run_flow_or_plain(cfg, use_prefect=args.prefect)
    except Exception as exc:
        if fresh is not None:
            _discard_fresh_output(fresh, exc)
        raise


def _say(args: argparse.Namespace, what: str) -> None:
    """One progress line on stderr (``kpca <command>: ...``), unless -q."""
    if not args.quiet:
        print(f"kpca {args.command}: {what}", file=sys.stderr, flush=True)


def _prefect_line(mode: str) -> str:
    """What a flow run waits for first: a temporary API server (10-60 s) or the server."""
    if mode == "ephemeral":
        return (
            "starting a temporary Prefect API server for this run (PREFECT_API_URL is not "
            "set; 10-60 s; --no-prefect runs without it)"
        )
    from prefect.settings import get_current_settings

    return f"recording the run at the Prefect API {get_current_settings().api.url}"


#: the first line of the commands that start a cluster or Prefect, before anything else
_START_LINES = {
    "demo": lambda a: (
        f"writing the built-in digits data to {Path(a.output).resolve()}-data/, then the run "
        f"to {Path(a.output).resolve()}/"
    ),
    "run": lambda a: f"checking {a.config}, its input and its output",
    "update": lambda a: f"checking {a.run} and {a.new_data}",
    "transform": lambda a: f"embedding {a.input} with {a.model} -> {a.output}",
}


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


def _load_run_config(args: argparse.Namespace, *, absolute: bool = True):
    from pipeline.config import load_config, with_absolute_paths

    cfg = load_config(args.config)
    if args.output:
        cfg.output.path = args.output
    args.location = str(cfg.output.path)  # what a store failure names if nothing else
    if args.overwrite:
        cfg.output.overwrite = True
    _cluster_overrides(cfg, args)
    if getattr(args, "keep_versions", None) is not None:
        cfg.output.keep_versions = args.keep_versions
    # relative paths against this folder, once: the manifest records where things are
    return with_absolute_paths(cfg) if absolute else cfg


def _cluster_overrides(cfg, args: argparse.Namespace) -> None:
    """--cluster and --worker-timeout over the config's cluster section."""
    from pipeline.config import ClusterConfig

    update = {}
    if getattr(args, "cluster", None):
        update["address"] = args.cluster
    if getattr(args, "worker_timeout", None) is not None:
        update["worker_timeout"] = args.worker_timeout
    if update:
        cfg.cluster = ClusterConfig.model_validate({**cfg.cluster.model_dump(), **update})


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _load_run_config(args)
    summary = _run_config(cfg, args)
    _print_summary(summary, cfg.output.path)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from pipeline.validate import validate

    cfg = _load_run_config(args, absolute=False)  # (its summary names paths as given)
    v = validate(cfg)
    for f in v.notes:
        print(f"kpca validate: note: {f.message}", file=sys.stderr)
    if not v.ok:
        for f in v.errors:
            print(f"kpca validate: error: {f.message}", file=sys.stderr)
        return EXIT_USAGE
    print(f"kpca validate: ok: {v.summary(cfg)}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from kpca_dask.cost import calibrate, default_calibration_path

    m = calibrate(quick=args.quick)
    out = Path(args.output) if args.output else default_calibration_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(m.to_dict(), indent=2))
    print(
        f"kpca calibrate: {m.cpu} [{m.simd}]: GEMM {m.gemm('float64') / 1e9:.1f} / "
        f"{m.gemm('float32') / 1e9:.1f} Gflop/s per core (float64/float32), exp "
        f"{m.exp('float64') / 1e6:.0f} M/s, memory {m.mem_bandwidth / 1e9:.1f} GB/s, "
        f"{m.task_seconds * 1e3:.2f} ms a task, round trip {m.roundtrip_seconds * 1e3:.0f} ms, "
        f"client-worker {m.network / 1e9:.2f} GB/s; block tasks on every core at "
        f"{m.factor('recompute', 'float32'):.2f}x / {m.factor('fill', 'float32'):.2f}x / "
        f"{m.factor('stored', 'float32'):.2f}x the one-core rates' time (float32 recompute / "
        f"fill / stored); wrote {out}"
    )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from dask.utils import parse_bytes

    from kpca_dask.cost import Cluster, load_machine
    from pipeline.config import load_config
    from pipeline.sizing import plan_run

    cfg = load_config(args.config)
    machine = load_machine(args.calibration) if args.calibration else load_machine()
    workers = args.workers or cfg.cluster.n_workers or 1
    threads = args.threads or cfg.cluster.threads_per_worker
    limit = args.memory or cfg.cluster.memory_limit
    if limit == "auto" and not cfg.cluster.address:
        # a local cluster's "auto" limit (dask's rule): this machine's memory per worker
        import psutil

        memory = psutil.virtual_memory().total / max(1, int(workers))
    else:
        memory = parse_bytes(limit) if limit and limit != "auto" else None
    cluster = Cluster(
        workers=int(workers),
        threads=int(threads),
        memory=float(memory) if memory else None,
        network=args.network * 1e9 / 8 if args.network else None,
    )
    rp = plan_run(
        cfg, cluster, machine, rows=args.rows, features=args.features, passes=args.passes
    )
    if args.json:
        print(json.dumps(rp.to_dict(), indent=2, default=str))
    else:
        print(rp.summary())
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
    from pipeline.config import InputConfig, absolute_path
    from pipeline.progress import show_progress

    if args.preimage != "auto" and not args.inverse:
        raise UserError("--preimage applies to --inverse only.")
    options = _storage_options(args)
    input_options = (
        _storage_options(args, "input_storage_options")
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
    from pipeline.cluster import dask_client
    from pipeline.config import ClusterConfig

    kw = {"address": args.cluster}
    if args.worker_timeout is not None:
        kw["worker_timeout"] = args.worker_timeout
    return dask_client(ClusterConfig(**kw))


def _transform(args: argparse.Namespace, inp, options: dict) -> int:
    from pipeline.config import ChunkConfig
    from pipeline.transform import transform_to_store

    if args.inverse:
        from pipeline.denoise import denoise_to_store

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
        unlabelled=args.unlabelled,
        no_ids=args.no_ids,
        ignore_extra=args.ignore_extra,
    )
    if args.keep_versions is not None:
        cfg.output.keep_versions = args.keep_versions
    _cluster_overrides(cfg, args)
    if args.prefect:
        from .runtime import check_prefect_api

        _say(args, _prefect_line(check_prefect_api()))
    fresh = _new_local_folder(cfg.output.path)
    try:
        with show_progress(args.progress):
            summary = run_update_flow_or_plain(cfg, use_prefect=args.prefect)
    except Exception as exc:
        if fresh is not None:  # a refused or failed update leaves no half-written version
            _discard_fresh_output(fresh, exc)
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
    sp.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bars"
    )


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return v


def _cluster_flags(sp: argparse.ArgumentParser, address: str | None) -> None:
    """--worker-timeout (and, with ``address``, --cluster)."""
    if address:
        sp.add_argument("--cluster", metavar="ADDRESS", help=address)
    sp.add_argument(
        "--worker-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="stop with one line naming a Dask worker that has not answered for this "
        "long (cluster.worker_timeout; default 120; docs/cluster.md)",
    )


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
    d = _subcommand(
        sub,
        "demo",
        cmd_demo,
        help="run the whole job on a built-in dataset",
        description="Writes scikit-learn's digits (1797 labelled 8x8 images) as Parquet to "
        "OUTPUT-data/ next to the run's folder, then runs the whole job on it into OUTPUT "
        "(replacing an earlier demo run there).",
    )
    d.add_argument(
        "--output",
        default="kpca-demo-output",
        help="artifact folder (default: ./kpca-demo-output); the demo's input data is "
        "written to OUTPUT-data/ beside it",
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
    _cluster_flags(r, None)
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
        "input exists and is readable, the columns and label are there, every row is "
        "read once (NaN/inf, text in numeric columns, missing labels, missing or "
        "repeated ids: the first of each with its row and column), the output is "
        "writable (nothing is "
        "left behind), and whether a complete run is already there. One line per "
        "problem; exit status 2 when there is one.",
    )
    c.add_argument("config", help="YAML config (see docs/config.md)")
    c.add_argument("--output", help="override output.path")
    c.add_argument("--overwrite", action="store_true", help="as `kpca run --overwrite`")


def _add_calibrate(sub) -> None:
    c = _subcommand(
        sub,
        "calibrate",
        cmd_calibrate,
        help="measure this machine's constants for `kpca plan` (about 30 s)",
        description="Measures GEMM and exp rates on one core, memory bandwidth, and on a "
        "one-worker LocalCluster the scheduler's seconds per task, the round trip of one "
        "graph and the client-worker bandwidth; writes them as JSON (default "
        "$KPCA_CALIBRATION, else ~/.cache/kpca/calibration.json), which `kpca plan` and "
        "the estimator's execution rule read. See docs/scaling.md.",
    )
    c.add_argument("--output", help="JSON file to write (default: see above)")
    c.add_argument("--quick", action="store_true", help="a few seconds, less precise")


def _add_plan(sub) -> None:
    c = _subcommand(
        sub,
        "plan",
        cmd_plan,
        help="predict a run's time, memory and bounds before it starts",
        description="Plans the configured run as `kpca run` would (solver, blocks) and "
        "prices it with the cost model on the cluster described (default: the config's "
        "cluster section) using the calibration file (`kpca calibrate`) or built-in "
        "constants: tasks and bytes moved per pass, memory per worker and on the client, "
        "time per stage and what bounds it. Starts nothing, writes nothing.",
    )
    c.add_argument("config", help="YAML config (see docs/config.md)")
    c.add_argument("--workers", type=int, help="worker processes (nodes)")
    c.add_argument("--threads", type=int, help="threads per worker")
    c.add_argument("--memory", help="memory per worker, e.g. 64GiB")
    c.add_argument("--network", type=float, help="network bandwidth per node in Gbit/s")
    c.add_argument("--rows", type=int, help="input rows (default: read from the input)")
    c.add_argument("--features", type=int, help="feature columns (default: from the input)")
    c.add_argument("--passes", type=int, help="solver passes (default: the expected number)")
    c.add_argument("--calibration", help="calibration JSON (default: kpca calibrate's)")
    c.add_argument("--json", action="store_true", help="the whole prediction as JSON")


def _add_transform(sub) -> None:
    t = _subcommand(
        sub, "transform", cmd_transform, help="embed new data with a saved model or run folder"
    )
    t.add_argument("model", help="run folder (verified) or model folder")
    t.add_argument("input", help="NPY, CSV, Parquet or zarr input (path or URL)")
    t.add_argument("output", help="output zarr folder, or a path ending in .parquet")
    t.add_argument(
        "--format",
        default="auto",
        choices=["auto", "npy", "csv", "parquet", "zarr"],
        help="the input's format (default: auto, from the file name's extension)",
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
    t.add_argument(
        "--chunk-mb",
        type=float,
        default=64.0,
        metavar="MB",
        help="target size of the input's row chunks in MB (default: 64); smaller uses "
        "less memory per task",
    )
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output (by default an existing output is refused)",
    )
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
    _cluster_flags(
        t,
        "Dask scheduler to transform on (tcp://host:8786); default: threads in this "
        "process. Its workers must see the model, input and output (probed first)",
    )
    _progress_flags(t)


def _add_info(sub) -> None:
    i = _subcommand(sub, "info", cmd_info, help="verify a run folder and summarise it")
    i.add_argument(
        "artifact_dir", help="a run folder (from `kpca run`, `demo` or `update`): path or URL"
    )
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
    up.add_argument(
        "--unlabelled",
        action="store_true",
        help="accept a batch without the base run's label column (its rows get no label)",
    )
    up.add_argument(
        "--no-ids",
        action="store_true",
        help="accept a batch without the base run's id column (the new run has no ids)",
    )
    up.add_argument(
        "--ignore-extra",
        action="store_true",
        help="add the batch with the base model's features even when it has other columns",
    )
    _storage_flags(up, "the base run and the new run (default for the new run: the base's)")
    up.add_argument(
        "--input-storage-options",
        metavar="JSON|FILE",
        help="fsspec options of NEW_DATA's URL (default: the base run's input options)",
    )
    _cluster_flags(
        up,
        "Dask scheduler to run on (default: the base run's cluster.address; empty there "
        "starts a local cluster)",
    )
    _progress_flags(up)
    _prefect_flags(up)


def _add_unlock(sub) -> None:
    u = _subcommand(
        sub, "unlock", cmd_unlock, help="break the lock a dead run left on an output folder"
    )
    u.add_argument(
        "output_dir",
        help="the output folder (path or URL) whose lock a run that died left behind; "
        "refused while the run holding it is alive on this host",
    )
    _storage_flags(u, "the output folder")


SUBCOMMANDS = [
    _add_demo,
    _add_run,
    _add_validate,
    _add_plan,
    _add_calibrate,
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
    from .runtime import quiet_libraries

    quiet_libraries(args.verbose)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _setup_logging(args)
    args.t0 = time.perf_counter()
    if args.command in _START_LINES:  # within a second or two: the imports come later
        _say(args, _START_LINES[args.command](args))
    from .runtime import handle_interrupts

    try:
        # SIGTERM like Ctrl-C, from the first line on (a flow installs its own meanwhile)
        with handle_interrupts(lambda: _interrupt_line(args)):
            if args.command not in ("run", "demo", "validate"):  # those start it themselves
                start_runtime(args)
            return args.func(args)
    except KeyboardInterrupt:
        return _interrupted(args)
    except Exception as exc:  # noqa: BLE001 - classified by the taxonomy, bugs re-shown
        from .runtime import interrupted

        if interrupted():  # Prefect reports the interrupted flow as its own exception
            return _interrupted(args)
        return _report_error(args.command, exc, _locations(args))


def _interrupt_line(args: argparse.Namespace) -> str:
    import signal

    from .runtime import interrupt_signal

    kept = " (finished stages are kept)" if args.command in ("run", "demo") else ""
    how = "stopped by SIGTERM" if interrupt_signal() == signal.SIGTERM else "interrupted"
    return (
        f"kpca {args.command}: {how} after {time.perf_counter() - args.t0:.0f} s{kept}; "
        "re-run the same command to resume."
    )


def _interrupted(args: argparse.Namespace) -> int:
    from .runtime import interrupt_status, report_interrupt, stop_children

    if os.environ.get("KPCA_DEBUG_INTERRUPT"):
        from .runtime import _INTERRUPT

        at = _INTERRUPT["at"]
        print(f"unwound in {time.monotonic() - at if at else -1:.2f} s", file=sys.stderr)

    report_interrupt(_interrupt_line(args))
    # what the unwinding did not stop (a temporary Prefect server, cluster workers) goes
    # now: nothing the command started outlives it
    stop_children(timeout=1.0)
    return interrupt_status()


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


def _locations(args: argparse.Namespace) -> str:
    """The location a command works on (for a store failure that names no object)."""
    for name in ("location", "artifact_dir", "output_dir", "output", "run"):
        v = getattr(args, name, None)
        if isinstance(v, str) and v:
            return v
    return ""


def _report_error(command: str, exc: Exception, where: str = "") -> int:
    """Print what went wrong as the taxonomy says (pipeline/errors.py); the exit status."""
    from pipeline.verify import describe_store_failure

    store = (
        None
        if _environment_error(exc)
        or (is_user_error(exc) and not isinstance(exc, PermissionError))
        else describe_store_failure(exc, where)
    )
    if store is not None:  # the store failed: the environment (exit 1), one line
        print(f"kpca {command}: error: {store}", file=sys.stderr)
        return EXIT_FAILED
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
        from pipeline.verify import endpoint_hint

        print(
            f"kpca {command}: error: {type(exc).__name__}: {exc} (I/O, network or lost "
            f"workers){endpoint_hint(exc)}; re-run the same command to resume.",
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
