"""Which batches a series has merged: each lineage entry an update writes records its
batch's identity (``source``: path, SHA-256, size, ETag, object version), so a batch is
merged exactly once, whatever its name and however often a night is re-run."""

from __future__ import annotations

from typing import Any

from pipeline.output import Location

from ..errors import UserError

__all__ = [
    "BatchAlreadyMerged",
    "check_base_current",
    "merged_by",
    "merged_entries",
    "merged_sources",
]


class BatchAlreadyMerged(UserError):
    """The batch is in the series already: a no-op night (``kpca update`` exits 0)."""

    def __init__(self, path: str, version: str, output: str):
        self.path, self.version, self.output = path, version, output
        super().__init__(
            f"the batch {path} is already merged (version {version} of {output}); "
            "nothing published"
        )


def _version_id(run: Any) -> str:
    """The version id of a version URL ``<out>/versions/<id>`` (else the URL itself)."""
    text = str(run or "").rstrip("/")
    head, _, vid = text.rpartition("/")
    return vid if head.endswith("/versions") else text


def merged_sources(manifest: dict[str, Any]) -> dict[str, str]:
    """``{sha256 digest: version id}`` of every batch the run's lineage records as merged
    (the version that merged it: the one whose rows the entry holds)."""
    out: dict[str, str] = {}
    for e in (manifest.get("update") or {}).get("rows") or []:
        src = e.get("source") or {}
        if src.get("sha256"):
            out.setdefault(str(src["sha256"]), _version_id(e.get("run")))
    return out


def merged_entries(manifest: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """``(source, version id)`` of every batch the run's lineage records as merged, in the
    order they were merged."""
    return [
        (dict(e["source"]), _version_id(e.get("run")))
        for e in (manifest.get("update") or {}).get("rows") or []
        if (e.get("source") or {}).get("sha256")
    ]


def merged_by(manifest: dict[str, Any], identity: dict[str, Any]) -> str | None:
    """The version that merged the batch with ``identity`` (None: not merged)."""
    return merged_sources(manifest).get(str(identity.get("sha256")))


def check_base_current(root: Location, base_url: str) -> None:
    """Under the output's lock, when the update's base is a version of the output it
    writes (a series): that version must still be the published one. Another night
    published meanwhile: refused in one line, nothing published (re-run the night: it
    starts from the new version and skips what that one merged)."""
    from pipeline.output import read_pointer

    head, _, vid = base_url.rstrip("/").rpartition("/")
    if head.rstrip("/") != root.url.rstrip("/") + "/versions":
        return  # the base is another output's version: never replaced under our lock
    now = (read_pointer(root) or {}).get("version")
    if now != vid:
        raise UserError(
            f"{root} published version {now} after this update started from version "
            f"{vid}; nothing published: re-run the update (it starts from {now})."
        )
