"""``kpca migrate``: bring an output written by an earlier release's layout to versions
(pipeline/output/migrate.py); every run and update of it does the same as it starts."""

from __future__ import annotations

import argparse

from .overrides import storage_options_arg

__all__ = ["cmd_migrate"]


def cmd_migrate(args: argparse.Namespace) -> int:
    from pipeline.errors import RunError
    from pipeline.output import Location, RunLock, inspect_migration, migrate_output

    out = Location.at(args.output_dir, storage_options_arg(args))
    if not out.exists():
        raise RunError(f"{args.output_dir} does not exist; check the path of the output.")
    if args.dry_run:
        plan = inspect_migration(out)
        head = "nothing changed" if plan.state == "current" else "dry run, nothing changed"
        print(f"kpca: {head}: {plan.describe()}")
        return 0
    with RunLock(out) as lock:  # no writer publishes meanwhile
        plan = migrate_output(out, lock=lock)
    print(f"kpca: {plan.describe()}")
    return 0
