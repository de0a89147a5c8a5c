"""The output's lifecycle, in one package: where a run's output is and how it is laid out,
its lock, its versions and their publishing, retention and holds, verified reads,
recovery and migration, and which files are ours. Every command, flow and reader outside
this package uses it through the names below (``from pipeline.output import ...``;
tests/test_layers.py checks that nothing outside imports a module of it).

The modules, bottom up:

* store.py (``Location``: a local folder or an fsspec URL, zarr groups, JSON) over
  storage_clients.py (the object-store clients' behaviour) and ownership.py (the marker
  a writer leaves on what it may replace);
* layout.py (every path a run writes, named once) and checksums.py (chunk digests);
* verify.py (verified reads: no missing chunk read as zeros) and completeness.py;
* lock.py over lock_objects.py (one writer per output, a lease);
* versions.py (the publishing transaction, the pointer, retention) and lineage.py (an
  update's lineage, and the holds retention obeys);
* export.py (the manifest, ``open_run`` and ``verify_run``), publish.py (what a writer
  may touch, publishing a transform's output), earlier_layout.py and migrate.py (an
  earlier release's output, migrated to versions).

The names are imported on first use (PEP 562), so ``import pipeline.output`` is cheap and
a module of this package may be imported without the others.
"""

from __future__ import annotations

from types import ModuleType

from pipeline._lazy_api import lazy_api

#: the public name -> the module of this package that defines it ("module:attr" when the
#: module names it differently; never a module's name, which its import would rebind)
API: dict[str, str] = {
    # location and layout
    "Location": "store",
    "BUCKET_SCHEMES": "store",
    "missing_bucket_message": "store",
    "run_layout": "layout",
    "RunLayout": "layout",
    "MANIFEST": "layout",
    "MODEL": "layout",
    "EMBEDDING": "layout",
    "PARQUET": "layout",
    "REPORT": "layout",
    "REPORT_MD": "layout",
    "ROW_ARRAYS": "layout",
    "SPECTRUM_ARRAYS": "layout",
    "RUN_NAMES": "layout",
    "UPDATE": "layout",
    "DRIFT_REPORT": "layout",
    "VERSIONS": "layout",
    "WRITING": "layout",
    # stored values: JSON, checksums, the manifest
    "read_json": "store",
    "atomic_write_json": "store",
    "json_default": "store",
    "array_checksum": "store",
    "digest_blocks": "checksums",
    "file_checksums": "export",
    "write_manifest": "export",
    "write_spectrum": "export",
    "read_spectrum": "export",
    # lock
    "RunLock": "lock",
    "LOCK_NAME": "lock",
    "check_unlocked": "lock",
    "alien_lock": "lock",
    "break_lock": "lock",
    # versions: the transaction, publishing, retention
    "Transaction": "versions",
    "read_pointer": "versions",
    "link_tree": "versions",
    "begin_run": "export",
    "check_not_complete": "export",
    "RunError": "export",
    "check_output_folder": "publish",
    "check_not_overlapping": "publish",
    "check_transform_output": "publish",
    "publish_output": "publish",
    "OUTPUT_MARK": "publish",
    # ownership
    "mark_folder": "store",
    # lineage and holds
    "entry_record": "lineage",
    "entry_rows": "lineage",
    "entry_split": "lineage",
    "rows_location": "lineage",
    "verify_entry": "lineage",
    "lineage_needs": "lineage",
    "public_options": "lineage",
    "write_holds": "lineage",
    "held_rows": "lineage",
    "kept_rows_location": "lineage",
    "fingerprint_at": "lineage",
    "hold_file": "lineage",
    # verified reads, completeness
    "open_run": "export",
    "verify_run": "export",
    "checked_array": "verify",
    "check_complete": "completeness",
    "DENSE": "completeness",
    "describe_store_failure": "verify",
    "endpoint_hint": "verify",
    # recovery and migration of an earlier release's output
    "migrate_output": "migrate:migrate",
    "inspect_migration": "migrate:inspect",
}

__all__ = list(API)


def _module(module: str) -> ModuleType:
    """This package's module ``module``, imported by name from a fixed list (no
    import of a computed name: tests/reliability/test_security.py)."""
    if module == "checksums":
        from . import checksums

        return checksums
    if module == "completeness":
        from . import completeness

        return completeness
    if module == "export":
        from . import export

        return export
    if module == "layout":
        from . import layout

        return layout
    if module == "lineage":
        from . import lineage

        return lineage
    if module == "lock":
        from . import lock

        return lock
    if module == "migrate":
        from . import migrate

        return migrate
    if module == "publish":
        from . import publish

        return publish
    if module == "store":
        from . import store

        return store
    if module == "verify":
        from . import verify

        return verify
    if module == "versions":
        from . import versions

        return versions
    raise AttributeError(f"module {__name__!r} has no module {module!r}")


__getattr__, __dir__ = lazy_api(__name__, API, _module)
