"""``kpca unlock``: break the lock a dead run left on its output (pipeline/output/lock.py);
``--force`` also removes a lock path that holds something kpca-dask did not write."""

from __future__ import annotations

import argparse

from .overrides import storage_options_arg

__all__ = ["cmd_unlock"]


def cmd_unlock(args: argparse.Namespace) -> int:
    from pipeline.output import LOCK_NAME, Location, alien_lock, break_lock

    force = bool(getattr(args, "force", False))
    out = Location.at(args.output_dir, storage_options_arg(args))
    if force:
        what = alien_lock(out)
        if what is not None:
            break_lock(out, force=True)
            print(f"kpca: removed {out.child(LOCK_NAME)} ({what})")
            return 0
    holder = break_lock(out, force=force)
    if holder is None:
        print(f"kpca: {args.output_dir} was not locked")
    else:
        print(f"kpca: removed the lock of {args.output_dir} ({holder.describe()})")
    return 0
