"""``kpca drain POOL``: stop a Prefect worker without killing the run it is running
(flows/drain.py)."""

from __future__ import annotations

import argparse

__all__ = ["cmd_drain"]


def cmd_drain(args: argparse.Namespace) -> int:
    from flows.drain import DrainError, drain_pool, resume_pool

    from ..runtime import quiet_prefect

    quiet_prefect()
    from prefect.settings import get_current_settings

    if not get_current_settings().api.url:
        raise DrainError(
            "PREFECT_API_URL is not set: kpca drain pauses a work pool on the server your "
            "workers poll; set PREFECT_API_URL to it (e.g. http://127.0.0.1:4200/api)."
        )
    if args.resume:
        resume_pool(args.pool)
        return 0
    drain_pool(
        args.pool,
        timeout=args.timeout,
        settle=args.settle,
        worker_pid=args.worker_pid,
    )
    return 0
