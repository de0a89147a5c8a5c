"""The flags every ``kpca`` subcommand shares and how a subcommand is declared (used by
parser.py and parser_ops.py)."""

from __future__ import annotations

import argparse


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


def _subcommand(sub, name: str, func, **kw) -> argparse.ArgumentParser:
    sp = sub.add_parser(name, **kw)
    _global_flags(sp, sub=True)
    sp.set_defaults(func=func)
    return sp
