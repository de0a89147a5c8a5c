"""An update's lineage, recorded and read verified.

``kpca update`` refits (and samples its drift reference) on every row a run has seen: the
ingest stores of the first run and of each batch, listed in the run's manifest
(``update.rows``, one entry per store). An entry records, when the run that lists it is
published:

* ``store`` and ``storage_options``: where the rows are and the fsspec options needed to
  read them (screened like every option the project writes: never credentials;
  pipeline/config.py ``check_storage_options``), so a chain on an object store whose
  endpoint is only in the options works at every step;
* ``fingerprint``: the ingest store's content fingerprint (pipeline/data/ingest.py);
  re-running the base with other data (of the same row count) changes it, and the
  update is refused in one line instead of refitting on other rows;
* ``digests_sha256``: a SHA-256 of the store's per-chunk digests, so the digests a read
  is checked against are the ones recorded when the run was published;
* ``split_checksum``: the published checksum of the ``split`` mask that marks the
  training rows (when a run's split marks them).

Every read of an entry (:func:`entry_rows`) checks the store's fingerprint and digests
record, that every chunk of ``X`` is present, and each chunk's values against its digest
as it is read (pipeline/output/verify.py): a deleted chunk is never read as zeros and an edited
value never refitted on. Entries written before these fields existed are read with the
checks their record allows (chunk presence, the store's own digests).

**A series never depends on removable state** (issue 36):

* ``run``: the version whose rows the entry holds. ``split_run`` / ``split_rows``: the
  training mask of the entry's rows is read from the run that lists the entry (each update
  re-points it to its own ``split``, which carries every row's, at ``split_rows``), so a
  later update never reads an earlier night's version folder.
* The rows stay where the lineage finds them: an output whose ``work/ingest.zarr`` is
  rebuilt with other rows while a hold names its rows keeps them first at
  ``work/ingest/<fingerprint>.zarr`` (pipeline/data/ingest_store.py, :func:`keep_held_rows`);
  :func:`rows_location` reads the recorded store, or that copy once the store holds other
  rows, and the next update records the copy's location.
* Holds: an update that publishes writes, in every other output its lineage names, one
  file ``<out>/holds/<sha256 of its URL>.json`` (:func:`write_holds`) naming the versions
  and the rows (fingerprints) its published lineage needs; retention
  (pipeline/output/versions.py)
  never removes a held version, the ingest stage never drops held rows. A holder rewrites
  its holds at each publish with what its new and its published version need, and writes
  an empty hold (``versions: []``, ``rows: []``) where it needs nothing any more.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
from typing import Any

import dask.array as da
import numpy as np

from pipeline.config import check_storage_options
from pipeline.errors import UserError

from .layout import HOLDS, INGEST_STORE, VERSIONS, WORK
from .store import Location, array_checksum, atomic_write_json, read_json
from .verify import check_present, checked_array, open_checked_group

__all__ = [
    "LineageError",
    "digests_sha256",
    "entry_record",
    "entry_rows",
    "entry_split",
    "held_rows",
    "hold_file",
    "kept_rows_location",
    "lineage_needs",
    "public_options",
    "read_holds",
    "rows_location",
    "verify_entry",
    "write_holds",
]

logger = logging.getLogger("pipeline")

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


def _parent(url: str) -> tuple[str, str]:
    """``(folder, name)`` of a URL or path (trailing slash ignored)."""
    head, _, name = url.rstrip("/").rpartition("/")
    return head, name


def kept_rows_location(store: Location, fingerprint: str) -> Location | None:
    """Where the rows of the ingest store ``<out>/work/ingest.zarr`` with ``fingerprint``
    are kept once that store is rebuilt with other rows: ``<out>/work/ingest/<fp>.zarr``
    (None: ``store`` is not an output's ingest store, or has no fingerprint)."""
    head, name = _parent(store.url)
    if name != INGEST_STORE or _parent(head)[1] != WORK or not fingerprint:
        return None
    safe = "".join(c if c.isalnum() else "-" for c in str(fingerprint))
    return Location.at(head, store.storage_options).child("ingest", f"{safe}.zarr")


def fingerprint_at(store: Location) -> str | None:
    """The fingerprint of the complete ingest store at ``store`` (None: none there)."""
    try:
        if not store.is_local:
            store.refresh()
        if not store.child("zarr.json").exists():
            return None
        attrs = dict(store.open_group("r").attrs)
    except Exception:  # noqa: BLE001 - absent or unreadable: not these rows
        return None
    if attrs.get("status") != "complete":
        return None
    return (attrs.get("result") or {}).get("fingerprint")


def rows_location(entry: dict[str, Any]) -> Location:
    """Where the entry's rows are: the recorded store while it holds the recorded
    fingerprint, else the copy its output kept when it rebuilt that store
    (:func:`kept_rows_location`) when that copy holds them; the recorded store otherwise
    (:func:`verify_entry` then says why it cannot be read)."""
    store = _store(entry)
    want = entry.get("fingerprint")
    if not want or fingerprint_at(store) == want:
        return store
    kept = kept_rows_location(store, want)
    if kept is not None and fingerprint_at(kept) == want:
        return kept
    return store


def verify_entry(entry: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The entry's ingest store (an open zarr group) and its attributes, after checking
    they are the ones the run was published with and that no chunk of ``X`` is missing;
    LineageError / CorruptObjectError (one line naming the store or chunk) otherwise."""
    store = rows_location(entry)
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
    read (:func:`pipeline.output.verify.checked_array`)."""
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
    g = open_checked_group(run, fix=_FIX)
    if "split" not in g:
        raise LineageError(
            f"the run {run} that marks the training rows of {entry['store']} has no split "
            f"mask any more; {_FIX}."
        )
    z = g["split"]
    check_present(z, allowed=entry.get("split_absent") or (), fix=_FIX)
    want = entry.get("split_checksum")
    if want and array_checksum(z, fix=_FIX) != want:
        raise LineageError(
            f"the split mask {run}/split that marks the training rows of {entry['store']} "
            f"changed since the base run was published; {_FIX}."
        )
    mask = np.asarray(checked_array(z, fix=_FIX).compute()).astype(bool)
    lo, hi = entry.get("split_rows") or (0, mask.shape[0])
    if hi - lo != int(entry["n_rows"]) or hi > mask.shape[0]:
        raise LineageError(
            f"the split mask {run}/split has {mask.shape[0]} rows, the lineage records rows "
            f"{lo}..{hi} of it for the {entry['n_rows']} rows of {entry['store']}; {_FIX}."
        )
    return mask[lo:hi]


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


# ---------------------------------------------------------------------- holds
def _version_ref(url: Any, options: dict | None) -> tuple[Location, str] | None:
    """``(output, version id)`` of a version folder ``<output>/versions/<id>`` (None: the
    URL names no version of an output, e.g. a run written before versions)."""
    if not isinstance(url, str) or not url:
        return None
    head, vid = _parent(url)
    root, name = _parent(head)
    if name != VERSIONS or not vid or not root:
        return None
    return Location.at(root, options), vid


def _rows_output(store: Any, options: dict | None) -> Location | None:
    """The output whose ``work/`` holds the ingest store ``store`` (``work/ingest.zarr``
    or a kept copy ``work/ingest/<fp>.zarr``); None for any other store."""
    if not isinstance(store, str):
        return None
    head, name = _parent(store)
    if name == INGEST_STORE and _parent(head)[1] == WORK:
        return Location.at(_parent(head)[0], options)
    up, folder = _parent(head)
    if folder == "ingest" and _parent(up)[1] == WORK and name.endswith(".zarr"):
        return Location.at(_parent(up)[0], options)
    return None


def lineage_needs(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What a lineage needs in each output it names, by the output's URL: ``location``
    (with the entry's options), ``versions`` (ids: the versions whose rows the entries
    hold, and the runs whose ``split`` marks them) and ``rows`` (fingerprint -> store)."""
    needs: dict[str, dict[str, Any]] = {}

    def need(loc: Location) -> dict[str, Any]:
        return needs.setdefault(
            loc.url.rstrip("/"), {"location": loc, "versions": set(), "rows": {}}
        )

    for e in entries:
        opts = e.get("storage_options")
        for url, o in (
            (e.get("run"), opts),
            (e.get("split_run"), e.get("split_storage_options", opts)),
        ):
            ref = _version_ref(url, o)
            if ref is not None:
                need(ref[0])["versions"].add(ref[1])
        out = _rows_output(e.get("store"), opts)
        if out is not None and e.get("fingerprint"):
            need(out)["rows"][e["fingerprint"]] = e["store"]
    return needs


def hold_file(root: Location, holder: str) -> Location:
    """``<root>/holds/<sha256 of the holder's URL>.json``: the holder's one hold there."""
    name = hashlib.sha256(holder.rstrip("/").encode()).hexdigest()[:32]
    return root.child(HOLDS, f"{name}.json")


def read_holds(root: Location) -> list[dict[str, Any]]:
    """The holds of ours in ``<root>/holds/`` (any other file there is ignored)."""
    folder = root.child(HOLDS)
    if not folder.is_local:
        folder.refresh()
    try:
        if not folder.exists():
            return []
        names = folder.fs.ls(folder.fs_path, detail=False)
    except FileNotFoundError:
        return []
    holds = []
    for n in sorted(str(n) for n in names):
        name = n.rstrip("/").rpartition("/")[2]
        if not name.endswith(".json"):
            continue
        try:
            data = read_json(folder.child(name))
        except Exception as exc:  # noqa: BLE001 - an unreadable hold holds nothing known
            logger.warning("lineage: the hold %s/%s cannot be read (%s)", folder, name, exc)
            continue
        if (
            isinstance(data, dict)
            and data.get("written_by") == "kpca-dask"
            and data.get("kind") == "hold"
        ):
            holds.append(data)
    return holds


def held_rows(root: Location) -> set[str]:
    """The fingerprints of the rows of ``root`` that some hold names."""
    return {
        str(r.get("fingerprint"))
        for h in read_holds(root)
        for r in h.get("rows") or []
        if isinstance(r, dict) and r.get("fingerprint")
    }


def write_holds(
    holder: Location, needs: dict[str, dict[str, Any]], released: tuple[str, ...] = ()
) -> list[str]:
    """Write the holder's hold in every output ``needs`` names (its own output excepted),
    each atomically; an empty hold in each output of ``released`` that ``needs`` does not
    name. Returns the URLs of the outputs held."""
    me = holder.url.rstrip("/")
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    held = []
    for url, n in sorted(needs.items()):
        if url == me:
            continue
        rows = [{"fingerprint": fp, "store": st} for fp, st in sorted(n["rows"].items())]
        atomic_write_json(
            hold_file(n["location"], me),
            {
                "written_by": "kpca-dask",
                "kind": "hold",
                "holder": me,
                "versions": sorted(n["versions"]),
                "rows": rows,
                "updated": now,
            },
        )
        held.append(url)
    for entry in released:
        url = entry["url"] if isinstance(entry, dict) else str(entry)
        if url.rstrip("/") in needs or url.rstrip("/") == me:
            continue
        loc = Location.at(url, entry.get("storage_options") if isinstance(entry, dict) else {})
        f = hold_file(loc, me)
        try:
            if f.exists():
                atomic_write_json(
                    f,
                    {
                        "written_by": "kpca-dask",
                        "kind": "hold",
                        "holder": me,
                        "versions": [],
                        "rows": [],
                        "updated": now,
                    },
                )
        except Exception as exc:  # noqa: BLE001 - a hold not released only keeps data
            logger.warning("lineage: could not release the hold %s (%s)", f, exc)
    return held
