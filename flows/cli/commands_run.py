"""``kpca run``, ``kpca demo`` and ``kpca validate``: a config's pre-start checks, then the
``kpca_pipeline`` flow (or the plain stages) and the run's summary."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from .console import interrupt_line, prefect_line, say, start_runtime
from .exits import EXIT_FAILED, EXIT_USAGE
from .fresh_output import discard_fresh_output, new_local_folder
from .overrides import cluster_overrides

__all__ = ["cmd_demo", "cmd_run", "cmd_validate", "prestart_checks"]


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _load_run_config(args)
    summary = _run_config(cfg, args)
    _print_summary(summary, cfg.output.path)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from pipeline.config import load_config
    from pipeline.data.demo_data import DEMO_DATASETS, write_demo_dataset

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


def cmd_validate(args: argparse.Namespace) -> int:
    from pipeline.data.validate import validate

    cfg = _load_run_config(args, absolute=False)  # (its summary names paths as given)
    v = validate(cfg)
    for f in v.notes:
        print(f"kpca validate: note: {f.message}", file=sys.stderr)
    if not v.ok:
        for f in v.errors:
            print(f"kpca validate: error: {f.message}", file=sys.stderr)
        # only a store or network that did not answer: the environment's (exit 1)
        return EXIT_FAILED if all(f.transient for f in v.errors) else EXIT_USAGE
    print(f"kpca validate: ok: {v.summary(cfg)}")
    return 0


def prestart_checks(cfg, command: str) -> None:
    """The pre-start checks (pipeline/data/validate.py): raise one error listing every problem
    before Prefect or Dask start and before anything is written; log the notes."""
    from pipeline.data.validate import validate

    v = validate(cfg)
    for note in v.notes:
        logging.getLogger("pipeline").info("%s: %s", command, note.message)
    v.raise_for_errors()


def _run_config(cfg, args: argparse.Namespace) -> Any:
    """The ``kpca_pipeline`` flow (or, with --no-prefect, the plain stages); either one
    connects to cfg.cluster itself. The input and output are checked first."""
    prestart_checks(cfg, args.command)
    if args.prefect:  # importing Prefect and Dask takes seconds: say what is under way
        say(args, "input and output checked; loading Prefect")
    start_runtime(args)
    from pipeline.runtime import show_progress

    from ..pipeline_flow import run_flow_or_plain
    from ..runtime import handle_interrupts

    if args.prefect:
        from pipeline.runner.run import check_begin

        from ..runtime import check_prefect_api

        mode = check_prefect_api()  # checked before anything is written
        say(args, prefect_line(mode))
        # refuse a locked output, or a complete run without overwrite, now, not after
        # starting a Prefect server (writing nothing: the flow may still refuse the run,
        # e.g. workers that cannot see it)
        check_begin(cfg)
    else:
        say(args, "starting the stages without Prefect")
    fresh = new_local_folder(cfg.output.path)
    try:
        with handle_interrupts(lambda: interrupt_line(args)), show_progress(args.progress):
            return run_flow_or_plain(cfg, use_prefect=args.prefect)
    except Exception as exc:
        if fresh is not None:
            discard_fresh_output(fresh, exc)
        raise


def _load_run_config(args: argparse.Namespace, *, absolute: bool = True):
    from pipeline.config import load_config, with_absolute_paths

    cfg = load_config(args.config)
    if args.output:
        cfg.output.path = args.output
    args.location = str(cfg.output.path)  # what a store failure names if nothing else
    if args.overwrite:
        cfg.output.overwrite = True
    cluster_overrides(cfg, args)
    if getattr(args, "keep_versions", None) is not None:
        cfg.output.keep_versions = args.keep_versions
    if getattr(args, "retention_grace_hours", None) is not None:
        cfg.output.retention_grace_hours = args.retention_grace_hours
    # relative paths against this folder, once: the manifest records where things are
    return with_absolute_paths(cfg) if absolute else cfg


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
