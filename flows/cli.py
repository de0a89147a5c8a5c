"""The ``kpca`` command line: a thin shell over the pipeline (and its Prefect flows).

    kpca demo [--output DIR]           the whole job on a built-in labelled dataset
    kpca run CONFIG [--output DIR]     the job a YAML config describes
    kpca transform MODEL INPUT OUTPUT  embed new data with a saved model (or run folder)
    kpca info ARTIFACT_DIR             what a run produced, after verifying it
    kpca unlock OUTPUT_DIR             break the lock a dead run left on its output

Exit status by the error taxonomy (pipeline/errors.py): errors in the input, the
config or the artifacts print one line naming the problem and the fix and exit with 2
(nothing is published); a failure of the environment (I/O, network, lost workers) prints
one line and exits with 1 (re-running resumes); an unexpected exception is a bug: its
traceback is kept and the status is 70 (EX_SOFTWARE).
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


class _NoTracebackForUserErrors(logging.Filter):
    """Prefect logs a failed task's traceback; a user error needs only its one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and is_user_error(exc):
            record.exc_info, record.exc_text = None, None
        return True


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
    print(
        f"  artifacts  {out}/manifest.json, model/, embedding, spectrum/"
        + (f", {den['array']}" if den else "")
        + (", embedding.parquet" if m["config"]["output"]["parquet"] else "")
        + (", report/report.md" if Path(out, "report", "report.md").exists() else "")
    )
    print(f"  inspect    kpca info {out}")


def _run_config(cfg, *, progress: bool | None, use_prefect: bool = True) -> Any:
    """The ``kpca_pipeline`` flow (or, with --no-prefect, the plain stages); either one
    connects to cfg.cluster itself."""
    from pipeline.progress import show_progress

    from .pipeline_flow import run_flow_or_plain

    if use_prefect:
        from .pipeline_flow import begin
        from .runtime import check_prefect_api

        if check_prefect_api() == "ephemeral":  # checked before anything is written
            # the temporary server lives for this command only: no telemetry from it
            os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        if not cfg.output.overwrite:
            begin(cfg)  # refuse a complete run now, not after starting a Prefect server
    with show_progress(progress):
        return run_flow_or_plain(cfg, use_prefect=use_prefect)


def cmd_run(args: argparse.Namespace) -> int:
    from pipeline.config import load_config

    cfg = load_config(args.config)
    if args.output:
        cfg.output.path = args.output
    if args.overwrite:
        cfg.output.overwrite = True
    summary = _run_config(cfg, progress=args.progress, use_prefect=args.prefect)
    _print_summary(summary, cfg.output.path)
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
    summary = _run_config(cfg, progress=args.progress, use_prefect=args.prefect)
    _print_summary(summary, str(out))
    return 0


def cmd_transform(args: argparse.Namespace) -> int:
    from pipeline.config import ChunkConfig, InputConfig
    from pipeline.progress import show_progress
    from pipeline.transform import transform_to_store

    inp = InputConfig(
        path=args.input,
        format=args.format,
        columns=args.columns.split(",") if args.columns else None,
        id_column=args.id_column,
        label_column=args.label_column,
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
        )
    print(
        f"kpca: embedded {res['rows']} rows into {res['components']} components -> "
        f"{res['output']} ({res['seconds']:.1f} s)"
    )
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import zarr

    from pipeline.export import verify_run
    from pipeline.store import Location

    out = Location(args.artifact_dir)
    m = verify_run(out, check_arrays=not args.no_verify)
    if args.json:
        print(json.dumps(m, indent=2))
        return 0
    g = zarr.open_group(out.zarr_store(), mode="r")
    ev = np.asarray(g["spectrum/eigenvalues"][...])
    evr = np.asarray(g["spectrum/explained_variance_ratio"][...])
    res = np.asarray(g["spectrum/residuals"][...])
    inp, model = m["input"], m["model"]
    skipped = " (skipped)" if args.no_verify else ""
    print(f"run        {args.artifact_dir}  [{m['status']}, verified{skipped}]")
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
    print(
        f"model      {model['solver']} solver, kernel {model['kernel']}, "
        f"{model['n_components']} components, {model['n_passes']} passes"
    )
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
    ks = m.get("kernel_store") or {}
    if ks:
        print(
            f"kernel     {'materialised' if ks.get('materialized') else 'recomputed per pass'}"
            f" ({ks.get('reason')})"
        )
    print(
        f"files      model/, embedding ({inp['n_rows']} x {len(ev)}), spectrum/"
        + (
            ", embedding.parquet"
            if Path(args.artifact_dir, "embedding.parquet").exists()
            else ""
        )
        + (", report/" if Path(args.artifact_dir, "report").exists() else "")
    )
    return 0


def cmd_unlock(args: argparse.Namespace) -> int:
    from pipeline.lock import break_lock

    holder = break_lock(args.output_dir)
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
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kpca", description="Distributed, out-of-core kernel PCA.")
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more logging (-v: stages and passes, -vv: debug)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def progress_flags(sp):
        sp.add_argument(
            "--progress",
            dest="progress",
            action="store_true",
            default=None,
            help="show progress bars (default: when stderr is a terminal)",
        )
        sp.add_argument("--no-progress", dest="progress", action="store_false")

    def prefect_flags(sp):
        sp.add_argument(
            "--no-prefect",
            dest="prefect",
            action="store_false",
            default=True,
            help="run the stages without Prefect (no run record, no task cache, "
            "no temporary API server; default: the kpca_pipeline flow, "
            "against PREFECT_API_URL or an ephemeral local API)",
        )

    d = sub.add_parser("demo", help="run the whole job on a built-in labelled dataset")
    d.add_argument(
        "--output",
        default="kpca-demo-output",
        help="artifact folder (default: ./kpca-demo-output)",
    )
    progress_flags(d)
    prefect_flags(d)
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser("run", help="run the job a YAML config describes")
    r.add_argument("config", help="YAML config (see docs/config.md)")
    r.add_argument("--output", help="override output.path")
    r.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a complete run there "
        "(with the flow: only the stages whose inputs changed run again)",
    )
    progress_flags(r)
    prefect_flags(r)
    r.set_defaults(func=cmd_run)

    t = sub.add_parser("transform", help="embed new data with a saved model or run folder")
    t.add_argument("model", help="run folder (verified) or model folder")
    t.add_argument("input", help="NPY, CSV, Parquet or zarr input (path or URL)")
    t.add_argument("output", help="output zarr folder, or a path ending in .parquet")
    t.add_argument(
        "--format", default="auto", choices=["auto", "npy", "csv", "parquet", "zarr"]
    )
    t.add_argument("--columns", help="comma-separated feature columns (tabular input)")
    t.add_argument("--id-column")
    t.add_argument("--label-column")
    t.add_argument("--chunk-mb", type=float, default=64.0)
    t.add_argument("--overwrite", action="store_true")
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
    progress_flags(t)
    t.set_defaults(func=cmd_transform)

    i = sub.add_parser("info", help="verify a run folder and summarise it")
    i.add_argument("artifact_dir")
    i.add_argument("--json", action="store_true", help="print the manifest")
    i.add_argument("--no-verify", action="store_true", help="skip the array checksums")
    i.set_defaults(func=cmd_info)

    u = sub.add_parser("unlock", help="break the lock a dead run left on an output folder")
    u.add_argument("output_dir")
    u.set_defaults(func=cmd_unlock)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    if args.command in ("demo", "run") and args.verbose == 0:
        level = logging.INFO
    logging.basicConfig(
        level=level, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S"
    )
    import distributed  # noqa: F401  (configures its loggers on import; quieten them after)

    if getattr(args, "prefect", False):
        # Prefect reads its settings once, on import. A first ephemeral server on a
        # fresh PREFECT_HOME migrates its database before answering, which on a
        # loaded machine takes longer than Prefect's 20 s default; wait longer.
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
        import prefect.main  # noqa: F401  (configures Prefect's loggers; quieten them after)

        for handler in logging.getLogger().handlers:
            handler.addFilter(_NoTracebackForUserErrors())

    for noisy in ("distributed", "prefect", "httpx", "asyncio", "tornado"):
        logging.getLogger(noisy).setLevel(
            logging.DEBUG if args.verbose >= 2 else logging.WARNING
        )
    t0 = time.perf_counter()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(
            f"kpca {args.command}: interrupted after {time.perf_counter() - t0:.0f} s; "
            "re-run the same command to resume.",
            file=sys.stderr,
        )
        return 130
    except Exception as exc:  # noqa: BLE001 - classified by the taxonomy, bugs re-shown
        return _report_error(args.command, exc)


def _user_message(exc: BaseException) -> str:
    """The error's message; pydantic's (a parameter given on the command line) in the
    config's words: the field and the problem, without pydantic's URLs."""
    from pydantic import ValidationError

    from pipeline.config import format_validation_error

    if isinstance(exc, ValidationError):
        return format_validation_error(exc, "the command-line arguments")
    return str(exc)


def _report_error(command: str, exc: Exception) -> int:
    """Print what went wrong as the taxonomy says (pipeline/errors.py); the exit status."""
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
        print(
            f"kpca {command}: error: {type(exc).__name__}: {exc} (I/O, network or lost "
            "workers); re-run the same command to resume.",
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
