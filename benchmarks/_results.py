"""Where a benchmark writes its results by default: never over an earlier file.

Result files are named by date (``<name>-<date>.json``); a second run the same day got
the same name and replaced the first, which docs/benchmarks.md may cite. :func:`fresh`
returns the name itself when it is free, else the same name with ``-2``, ``-3``, ...
before the suffix. An explicit ``--out`` is the user's choice and is written as given.
"""

from __future__ import annotations

from pathlib import Path


def fresh(path: Path) -> Path:
    """``path`` if no file is there, else the first free ``<stem>-<i><suffix>`` (i >= 2);
    the folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    i = 2
    out = path
    while out.exists():
        out = path.with_name(f"{path.stem}-{i}{path.suffix}")
        i += 1
    return out
