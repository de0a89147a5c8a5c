"""``kpca unlock``: break the lock a dead run left on its output (pipeline/lock.py)."""

from __future__ import annotations

import argparse

from .overrides import storage_options_arg

__all__ = ["cmd_unlock"]


def cmd_unlock(args: argparse.Namespace) -> int:
    from pipeline.lock import break_lock
    from pipeline.store import Location

    holder = break_lock(Location.at(args.output_dir, storage_options_arg(args)))
    if holder is None:
        print(f"kpca: {args.output_dir} was not locked")
    else:
        print(f"kpca: removed the lock of {args.output_dir} ({holder.describe()})")
    return 0
