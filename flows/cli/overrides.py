"""Command-line values over a config: ``--storage-options`` (parsed, credentials refused)
and the cluster flags (``--cluster``, ``--worker-timeout``)."""

from __future__ import annotations

import argparse

__all__ = ["cluster_overrides", "storage_options_arg"]


def storage_options_arg(args: argparse.Namespace, flag: str = "storage_options") -> dict:
    """A command's ``--storage-options`` (JSON or a YAML file; credentials refused)."""
    from pipeline.config import parse_storage_options

    return parse_storage_options(getattr(args, flag, None), "--" + flag.replace("_", "-"))


def cluster_overrides(cfg, args: argparse.Namespace) -> None:
    """--cluster and --worker-timeout over the config's cluster section."""
    from pipeline.config import ClusterConfig

    update = {}
    if getattr(args, "cluster", None):
        update["address"] = args.cluster
    if getattr(args, "worker_timeout", None) is not None:
        update["worker_timeout"] = args.worker_timeout
    if update:
        cfg.cluster = ClusterConfig.model_validate({**cfg.cluster.model_dump(), **update})
