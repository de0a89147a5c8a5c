"""The ``kpca`` command line's arguments (argparse): the global flags, one function per
subcommand declaring its arguments, the flags several subcommands share, and
:func:`parse_args`, which merges -v/-q given before or after the subcommand."""

from __future__ import annotations

import argparse

from .commands_info import cmd_info
from .commands_plan import cmd_calibrate, cmd_plan
from .commands_run import cmd_demo, cmd_run, cmd_validate
from .commands_transform import cmd_transform
from .commands_update import cmd_update
from .parser_common import _global_flags, _storage_flags, _subcommand
from .parser_ops import _add_drain, _add_migrate, _add_unlock

__all__ = ["SUBCOMMANDS", "build_parser", "parse_args"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kpca-dask")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        from kpca_dask import __version__

        return __version__


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


def _positive_int(text: str) -> int:
    """A count of at least 1 (workers, threads, passes, rows)."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return v


def _positive_float(text: str) -> float:
    """A finite number above 0 (a bandwidth)."""
    import math

    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number above 0")
    return v


#: The largest memory a worker is priced with (1 EiB): beyond it a typo, not a node.
_MAX_MEMORY = float(1 << 60)


def _memory(text: str) -> str:
    """A memory size dask reads (``64GiB``, ``8e9``), above 0 and at most 1 EiB; the text
    itself (``kpca plan`` parses it again as the config's value)."""
    from dask.utils import parse_bytes

    try:
        v = float(parse_bytes(text))
    except (ValueError, OverflowError, TypeError):
        v = -1.0
    if not 0 < v <= _MAX_MEMORY:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a memory size above 0 and at most 1 EiB (e.g. 64GiB)"
        )
    return text


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


def _keep_flag(p) -> None:
    p.add_argument(
        "--keep-versions",
        type=int,
        metavar="N",
        help="how many published versions of the output to keep, the new one included "
        "(default: output.keep_versions, 7); older ones are deleted once it is published",
    )
    p.add_argument(
        "--retention-grace-hours",
        type=_grace_hours,
        metavar="H",
        help="how long a version that left the kept ones stays on the store for readers "
        "that opened it (default: output.retention_grace_hours, 24); 0 deletes it when "
        "it expires",
    )


def _grace_hours(text: str) -> float:
    import math

    try:
        h = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of hours: {text!r}") from None
    if not math.isfinite(h) or not 0 <= h <= 24 * 366:
        raise argparse.ArgumentTypeError(f"{text} hours: give 0 to {24 * 366} (a year)")
    return h


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
        description="Measures GEMM and exp rates on one core, memory bandwidth, the local "
        "disk and Parquet encoding, an object store's rates (--store), the scheduler's "
        "seconds per task and the round trip of one graph with the scheduler in its own "
        "process, and on a LocalCluster the client-worker bandwidth and the block tasks; "
        "writes them as JSON (default "
        "$KPCA_CALIBRATION, else ~/.cache/kpca/calibration.json), which `kpca plan` and "
        "the estimator's execution rule read. See docs/scaling.md.",
    )
    c.add_argument("--output", help="JSON file to write (default: see above)")
    c.add_argument("--quick", action="store_true", help="a few seconds, less precise")
    c.add_argument(
        "--store",
        metavar="URL",
        help="also measure this object store (e.g. s3://bucket/tmp): request latency, one "
        "stream's and all streams' bandwidth; a few objects are written below it and "
        "removed again. `kpca plan` prices inputs and outputs on that URL scheme with them",
    )
    _storage_flags(c, "--store")


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
    c.add_argument("--workers", type=_positive_int, help="worker processes (nodes)")
    c.add_argument("--threads", type=_positive_int, help="threads per worker")
    c.add_argument("--memory", type=_memory, help="memory per worker, e.g. 64GiB")
    c.add_argument(
        "--network", type=_positive_float, help="network bandwidth per node in Gbit/s"
    )
    c.add_argument(
        "--rows", type=_positive_int, help="input rows (default: read from the input)"
    )
    c.add_argument(
        "--features", type=_positive_int, help="feature columns (default: from the input)"
    )
    c.add_argument(
        "--passes", type=_positive_int, help="solver passes (default: the expected number)"
    )
    c.add_argument("--calibration", help="calibration JSON (default: kpca calibrate's)")
    c.add_argument(
        "--driver",
        choices=["blocks", "workers"],
        default="blocks",
        help="the solve's driver priced: blocks (as the fit runs today: a task per kernel "
        "or row block) or workers (a few tasks per worker and a reduction tree per pass, "
        "the basis on the workers; docs/scaling.md)",
    )
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
    up.add_argument(
        "run", help="the series: a published output; each batch is a new version of it"
    )
    up.add_argument(
        "new_data",
        help="the batches: a file, a folder or prefix, a glob, or a template on the logical "
        "date (s3://b/in/{date:%%Y-%%m-%%d}/*.parquet); each batch not merged yet, "
        "oldest first",
    )
    up.add_argument(
        "--output",
        help="start another output from RUN instead (default: new versions of RUN itself)",
    )
    up.add_argument(
        "--logical-date",
        metavar="DATE",
        help="the date NEW_DATA's {date} template is formatted with (default: now, UTC)",
    )
    up.add_argument(
        "--duplicate-ids",
        choices=["refuse", "keep"],
        help="a batch with ids the series has: refuse (default) or keep both rows",
    )
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
    _add_drain,
    _add_migrate,
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
