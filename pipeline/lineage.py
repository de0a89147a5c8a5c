"""An update's lineage, recorded and read verified.

``kpca update`` refits (and samples its drift reference) on every row a run has seen: the
ingest stores of the first run and of each batch, listed in the run's manifest
(``update.rows``, one entry per store). An entry records, when the run that lists it is
published:

* ``store`` and ``storage_options``: where the rows are and the fsspec options needed to
  read them (screened like every option the project writes: never credentials;
  pipeline/config.py ``check_storage_options``), so a chain on an object store whose
  endpoint is only in the options works at every step;
* ``fingerprint``: the ingest store's content fingerprint (pipeline/ingest.py);
  re-running the base with other data (of the same row count) changes it, and the
  update is refused in one line instead of refitting on other rows;
* ``digests_sha256``: a SHA-256 of the store's per-chunk digests, so the digests a read
  is checked against are the ones recorded when the run was published;
* ``split_checksum``: the published checksum of the ``split`` mask that marks the
  training rows (when a run's split marks them).

Every read of an entry (:func:`entry_rows`) checks the store's fingerprint and digests
record, that every chunk of ``X`` is present, and each chunk's values against its digest
as it is read (pipeline/verify.py): a deleted chunk is never read as zeros and an edited
value never refitted on. Entries written before these fields existed are read with the
checks their record allows (chunk presence, the store's own digests).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import dask.array as da
import numpy as np

from .config import check_storage_options
from .errors import UserError
from .store import Location, array_checksum
from .verify import check_present, checked_array, open_checked_group

__all__ = [
    "LineageError",
    "digests_sha256",
    "entry_record",
    "entry_rows",
    "entry_split",
    "public_options",
    "verify_entry",
]

_FIX = "restore the run from a copy, or re-run the full pipeline (kpca run) instead"


class LineageError(UserError, ValueError):
    """A lineage entry's rows are not the rows the run was published with."""


def public_options(options: dict[str, Any] | None, what: str) -> dict[str, Any]:
    """``options`` to record in a manifest: screened for credentials (refused, naming the
    keys, never the values: pipeline/config.py)."""
    try:
        return dict(check_storage_options(dict(options or {}), what))
    except ValueError as exc:
        raise LineageError(str(exc)) from exc


def digests_sha256(attrs: dict[str, Any]) -> str | None:
    """SHA-256 of an ingest store's per-chunk digests record (None: it has none)."""
    d = attrs.get("digests")
    if not isinstance(d, dict):
        return None
    text = json.dumps(d, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _store(entry: dict[str, Any]) -> Location:
    return Location.at(entry["store"], dict(entry.get("storage_options") or {}))


def verify_entry(entry: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The entry's ingest store (an open zarr group) and its attributes, after checking
    they are the ones the run was published with and that no chunk of ``X`` is missing;
    LineageError / CorruptObjectError (one line naming the store or chunk) otherwise."""
    store = _store(entry)
    if not store.exists():
        raise LineageError(
            f"the ingest store {store} that holds rows of the base run is gone; the refit "
            "and the drift reference need it: re-run the full pipeline (kpca run) instead."
        )
    g = open_checked_group(store, fix=_FIX)
    attrs = dict(g.attrs)
    if attrs.get("status") != "complete" or "X" not in g:
        raise LineageError(
            f"the ingest store {store} that holds rows of the base run is incomplete "
            f"(being rebuilt?); {_FIX}."
        )
    want = entry.get("fingerprint")
    got = (attrs.get("result") or {}).get("fingerprint")
    if want and got != want:
        raise LineageError(
            f"the ingest store {store} no longer holds the rows the base run was published "
            f"with (fingerprint {got}, the lineage records {want}): it was re-run or rebuilt "
            f"with other data since; {_FIX}."
        )
    want = entry.get("digests_sha256")
    if want and digests_sha256(attrs) != want:
        raise LineageError(
            f"the chunk digests recorded in the ingest store {store} changed since the base "
            f"run was published; {_FIX}."
        )
    X = g["X"]
    if X.shape[0] != entry["n_rows"]:
        raise LineageError(
            f"the ingest store {store} holds {X.shape[0]} rows, the base run recorded "
            f"{entry['n_rows']}; it was rebuilt since: re-run the full pipeline instead."
        )
    check_present(X, fix=_FIX)  # ours write every chunk: an absent one is damage
    return g, attrs


def entry_rows(entry: dict[str, Any]) -> da.Array:
    """The entry's rows (lazy), every chunk checked against its recorded digest as it is
    read (:func:`pipeline.verify.checked_array`)."""
    g, attrs = verify_entry(entry)
    hexd = (attrs.get("digests") or {}).get("X")
    digests = np.frombuffer(bytes.fromhex(hexd), dtype=np.uint8) if hexd else None
    return checked_array(
        g["X"], digests=digests, fix=_FIX, what="when the base run was published"
    )


def entry_split(entry: dict[str, Any]) -> np.ndarray | None:
    """The training mask of the entry (None: every row is a training row), read verified:
    chunks present and, when recorded, its published checksum."""
    if not entry.get("split_run"):
        return None
    run = Location.at(
        entry["split_run"], entry.get("split_storage_options", entry.get("storage_options"))
    )
    z = open_checked_group(run, fix=_FIX)["split"]
    check_present(z, allowed=entry.get("split_absent") or (), fix=_FIX)
    want = entry.get("split_checksum")
    if want and array_checksum(z, fix=_FIX) != want:
        raise LineageError(
            f"the split mask {run}/split that marks the training rows of {entry['store']} "
            f"changed since the base run was published; {_FIX}."
        )
    return np.asarray(checked_array(z, fix=_FIX).compute()).astype(bool)


def entry_record(
    store: Location,
    *,
    n_rows: int,
    fingerprint: str | None,
    split_run: Location | None = None,
    split_checksum: str | None = None,
    split_absent: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A lineage entry for the ingest store at ``store`` as it is now (its digests
    record), with the options to read it (and the run whose split marks its training
    rows); ``extra`` (e.g. ``run``) is kept."""
    attrs = dict(open_checked_group(store, fix=_FIX).attrs)
    entry: dict[str, Any] = {
        "store": store.url,
        "storage_options": public_options(store.storage_options, "the lineage's options"),
        "n_rows": int(n_rows),
        "fingerprint": fingerprint,
        "digests_sha256": digests_sha256(attrs),
        "split_run": split_run.url if split_run is not None else None,
        **extra,
    }
    if split_run is not None:
        entry["split_storage_options"] = public_options(
            split_run.storage_options, "the lineage's options"
        )
        entry["split_checksum"] = split_checksum
        if split_absent:
            entry["split_absent"] = list(split_absent)
    return entry
