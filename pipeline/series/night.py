"""One night of a series: every batch ``NEW_DATA`` names that the series has not merged,
oldest first, each published as one version of the output (its base: the version
published before it).

One version per batch, not one per night: each version's lineage entry is one batch, so
"which version merged this batch" has one answer, a bad batch costs only itself (the
batches before it are published; the night goes on with the ones after it and fails at
the end naming it), and a killed night resumes at the batch it was in (work/ keeps its
ingest store). A template on the logical date catches up (pipeline/series/batches.py): a
night also merges the earlier dates' batches no night merged -- a killed night's, a
refused one fixed since, one landed late -- oldest date first. A refused batch stays
pending: each later night tries it again and fails naming it (after publishing its own
batches) until it is fixed or removed. After an outage the late runs each merge their own
date (and anything older left behind), in date order.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.output import Location

from ..config import PipelineConfig, absolute_path
from ..errors import UserError
from .batches import Batch, pending_batches
from .merged import BatchAlreadyMerged, merged_entries, merged_sources

__all__ = ["NightResult", "parse_logical_date", "run_night"]

logger = logging.getLogger("pipeline")


@dataclass
class NightResult:
    """What a night did: the batches merged (path, version id), those the series had
    already (path, the version that merged each), those refused (path, the one line why)."""

    output: str
    merged: list[tuple[str, str | None]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    summaries: list[Any] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refused


def parse_logical_date(value: Any) -> datetime.datetime | None:
    """A logical date from the command line or Prefect (ISO date or date-time; a
    datetime passes through); None stays None (the template uses now, UTC)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime.datetime):
        return value
    if isinstance(value, datetime.date):
        return datetime.datetime(value.year, value.month, value.day, tzinfo=datetime.UTC)
    try:
        return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise UserError(
            f"--logical-date {value!r} is not an ISO date (2026-11-25) or date-time "
            "(2026-11-25T02:30:00+00:00)."
        ) from None


def _published(run: str, options: dict[str, Any]) -> dict[str, Any]:
    from pipeline.output import open_run
    from pipeline.update import latest_run

    loc = Location.at(run, options)
    newest = latest_run(loc)
    return open_run(newest or loc).manifest


def run_night(
    run: str,
    new_data: str,
    make_config: Callable[[str, str, str | None], PipelineConfig],
    run_one: Callable[[PipelineConfig], Any],
    *,
    output: str | None = None,
    storage_options: dict[str, Any] | None = None,
    input_storage_options: dict[str, Any] | None = None,
    logical_date: datetime.datetime | None = None,
) -> NightResult:
    """Merge every pending batch of ``new_data`` into the series ``run``, oldest first.

    ``make_config(base, batch, output)`` builds one batch's update config
    (pipeline/update/setup.py ``update_config`` with the command's options);
    ``run_one(cfg)`` runs it (plain stages or the Prefect flow) and returns its summary.
    With ``output``, the first batch starts that output from ``run`` and the later ones
    are new versions of it. A refused batch (a user error: bad rows, duplicate ids,
    missing columns) is recorded and the night goes on; any other error stops it."""
    run = absolute_path(run)
    opts = dict(storage_options or {})
    manifest = _published(run, opts)
    in_opts = input_storage_options
    if in_opts is None:
        in_opts = dict(
            (manifest.get("config") or {}).get("input", {}).get("storage_options") or {}
        )
    merged = merged_sources(manifest)
    pending, done = pending_batches(
        new_data, merged, in_opts, logical_date=logical_date, sources=merged_entries(manifest)
    )
    target = absolute_path(output) if output else run
    result = NightResult(output=target)
    for b, vid in done:
        result.skipped.append((b.path, vid))
        logger.info("series: %s already merged (version %s); skipped", b.path, vid)
    base = run
    for b in pending:
        out = output if (output and base == run) else None
        try:
            cfg = make_config(base, b.path, out)
            summary = run_one(cfg)
        except BatchAlreadyMerged as exc:  # merged meanwhile by another writer
            result.skipped.append((b.path, exc.version))
            continue
        except Exception as exc:
            if not _batch_problem(exc):
                raise  # the output, the cluster, the store: the night stops here
            line = _one_line(exc)
            result.refused.append((b.path, line))
            result.errors.append(exc)
            logger.warning("series: the batch %s was refused: %s", b.path, line)
            continue
        base = target
        result.summaries.append(summary)
        result.merged.append((b.path, _version_of(summary)))
    return result


def _batch_problem(exc: BaseException) -> bool:
    """Whether ``exc`` refuses this batch only (its rows, columns or ids), so the night
    goes on with the next one."""
    from pipeline.data.checks.findings import PrestartError
    from pipeline.data.features import FeatureError
    from pipeline.data.readers.base import InputError
    from pipeline.update import UpdateError

    return isinstance(exc, UpdateError | PrestartError | InputError | FeatureError)


def _one_line(exc: BaseException) -> str:
    findings = getattr(exc, "findings", None) or getattr(exc, "errors", None)
    if findings and not isinstance(findings, str):
        first = findings[0]
        return str(getattr(first, "message", first))
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _version_of(summary: Any) -> str | None:
    v = getattr(summary, "version", None)
    if v is None and isinstance(summary, dict):
        v = summary.get("version")
    return v


def describe(b: Batch) -> str:
    return f"{b.path} ({b.digest[:19]})"
