"""The ``kpca`` operations on an output or a worker, not on data: ``unlock``, ``drain``
and ``migrate`` (their arguments; parser.py assembles the command line)."""

from __future__ import annotations

from .commands_drain import cmd_drain
from .commands_migrate import cmd_migrate
from .commands_unlock import cmd_unlock
from .parser_common import _storage_flags, _subcommand


def _add_unlock(sub) -> None:
    u = _subcommand(
        sub, "unlock", cmd_unlock, help="break the lock a dead run left on an output folder"
    )
    u.add_argument(
        "output_dir",
        help="the output folder (path or URL) whose lock a run that died left behind; "
        "refused while the run holding it is alive on this host",
    )
    u.add_argument(
        "--force",
        action="store_true",
        help="also remove a lock path that holds something kpca-dask did not write (not "
        "JSON, JSON that is not a lock record, a folder); a lock held by a live run on "
        "this host is still refused",
    )
    _storage_flags(u, "the output folder")


def _add_drain(sub) -> None:
    d = _subcommand(
        sub,
        "drain",
        cmd_drain,
        help="stop a Prefect worker without killing the flow run it is running",
        description="Pauses the work pool (no new flow run starts on its workers; nights "
        "that come due wait and start on resume), waits until no flow run of the pool is "
        "pending or running, then stops the worker given by --worker-pid with SIGTERM. "
        "A worker stopped with a run in flight kills that run (deploy/README.md).",
    )
    d.add_argument("pool", help="the work pool (e.g. kpca-process)")
    d.add_argument(
        "--worker-pid",
        type=int,
        metavar="PID",
        help="the worker process to stop once the pool is drained (default: stop it yourself)",
    )
    d.add_argument(
        "--timeout",
        type=float,
        default=6 * 3600,
        metavar="SECONDS",
        help="give up (the pool stays paused, nothing stopped) after this long (default 6 h)",
    )
    d.add_argument(
        "--settle",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="how long the pool must stay idle to count as drained: longer than the "
        "workers' polling interval (PREFECT_WORKER_QUERY_SECONDS, default 10) (default 15)",
    )
    d.add_argument(
        "--resume",
        action="store_true",
        help="resume the pool instead (waiting flow runs start on its workers)",
    )


def _add_migrate(sub) -> None:
    m = _subcommand(
        sub,
        "migrate",
        cmd_migrate,
        help="bring an output written by an earlier release's layout to versions/",
        description="An output written before versions/ (its manifest, model/, embedding "
        "and embedding.parquet at its top level) becomes its first published version "
        "(versions/<id>/, kept in the history) and its old top-level paths are removed, "
        "holding the output's lock. Every run and update of such an output does the same as "
        "it starts; readers of the old paths read pipeline.open_run(OUT) or the manifest's "
        "version_path instead (docs/artifacts.md, Upgrades).",
    )
    m.add_argument("output_dir", help="the output folder (path or URL)")
    m.add_argument(
        "--dry-run",
        action="store_true",
        help="say what would be migrated or removed, and change nothing",
    )
    _storage_flags(m, "the output folder")
