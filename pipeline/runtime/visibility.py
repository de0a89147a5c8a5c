"""Can every Dask worker see the run's locations? Checked before any stage.

On one machine the client and the workers share a disk; on a cluster they share only
what is mounted on every node, or an object store. A worker that cannot see a local
output path writes its chunks to its own disk under the client's path, and the next
stage reads zeros. So before the first stage a run probes each location:

- the input (read only): the client takes a signature of it (size and a hash of the
  first bytes of a file; names and sizes of a folder's entries) and every worker takes
  the same; a worker that finds nothing, or something else, cannot see it;
- the output and the work folder (written): the client writes a probe file there and
  every worker reads it back; then every worker writes one and the client reads them.
  The probe files (``.kpca-probe-<time>-<random>.*``: unique per probe) and any folder
  the probe created are removed afterwards in any case (refusal, timeout, error), on the
  workers' side as well as the client's; those a killed client left are removed by the
  next probe of that folder once they are an hour old.
- a read-only model or base run (``kpca transform``, ``kpca update``): as the input.

Every command that writes probes before writing anything: ``kpca run``, ``kpca update``,
``kpca transform`` (and ``--inverse``) and their Prefect flows (:func:`run_targets`,
:func:`transform_targets`). Each worker is asked separately, with the run's
``cluster.worker_timeout``: a worker that does not answer is named in one line
(:class:`pipeline.runtime.liveness.WorkerTimeoutError`, exit 1) instead of a hang.

A failure is refused with one line (:class:`VisibilityError`, a UserError: exit 2) that
names each location, the workers that cannot see it and the fix, before anything is
published. The probe costs two round trips to the workers and a few small files (its log
line gives the time). Without a distributed client (dask's threads in this process)
there are no other processes to probe, and the log says so. The probe files and what
each worker runs are in pipeline/runtime/probe_files.py.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from pipeline.errors import UserError
from pipeline.output import Location
from pipeline.runtime.probe_files import (
    PROBE_PREFIX,
    ProbeTarget,
    create_folders,
    describe_exception,
    missing_folders,
    new_token,
    probe_file,
    read_text,
    remove_created,
    remove_probe_file,
    remove_stale_probes,
    signature,
    worker_clean,
    worker_look,
    write_text,
)

__all__ = [
    "PROBE_PREFIX",
    "ProbeTarget",
    "VisibilityError",
    "check_locations",
    "check_visibility",
    "missing_folders",
    "remove_stale_probes",
    "remove_created",
    "run_targets",
    "signature",
    "transform_targets",
]

logger = logging.getLogger("pipeline")

#: how many worker addresses a message names before "and N more"
SHOWN_WORKERS = 4


class VisibilityError(UserError, RuntimeError):
    """A worker cannot see (read, or write and read back) a location of the run."""


def run_targets(cfg) -> list[ProbeTarget]:
    """The locations of the run ``cfg`` describes: its input (read), its output and its
    work folder (written)."""
    from pipeline.output import run_layout

    lay = run_layout(cfg)
    targets = [ProbeTarget("input", cfg.input.path, dict(cfg.input.storage_options), False)]
    update = getattr(cfg, "update", None)
    if update is not None and update.base:  # kpca update: the base run is read too
        base = Location.at(update.base, update.base_storage_options)
        targets.append(ProbeTarget("base run", base.url, dict(base.storage_options), False))
        targets += _lineage_targets(base)
    return targets + [
        ProbeTarget("output", lay.root.url, dict(lay.root.storage_options), True),
        ProbeTarget("work folder", lay.work.url, dict(lay.work.storage_options), True),
    ]


def _lineage_targets(base: Location) -> list[ProbeTarget]:
    """The ingest stores of an update's lineage outside the base run (earlier runs' rows,
    read by the workers for a refit and the drift reference), from the base's manifest;
    none when it cannot be read (the update's base stage then says why)."""
    from pipeline.output import MANIFEST, read_json

    try:
        rows = (read_json(base.child(MANIFEST)).get("update") or {}).get("rows") or []
    except Exception:  # noqa: BLE001 - not this check's to report
        return []
    found: dict[str, ProbeTarget] = {}
    for r in rows:
        url = str(r.get("store") or "")
        if url and not _inside(url, base.url) and url not in found:
            loc = Location.at(url, r.get("storage_options") or {})
            found[url] = ProbeTarget("", loc.url, dict(loc.storage_options), False)
    many = len(found) > 1  # roles name the targets: each its own
    return [
        ProbeTarget(f"lineage store{f' {i}' if many else ''}", t.url, t.storage_options, False)
        for i, t in enumerate(found.values(), 1)
    ]


def transform_targets(
    model: str, input_cfg, output: Location, storage_options: dict | None = None
) -> list[ProbeTarget]:
    """The locations of ``kpca transform`` (and ``--inverse``): the model (or its run
    folder) and the input, read; the output, written."""
    m = Location.at(model, storage_options)
    return [
        ProbeTarget("model", m.url, dict(m.storage_options), False),
        ProbeTarget("input", input_cfg.path, dict(input_cfg.storage_options), False),
        ProbeTarget("output", output.url, dict(output.storage_options), True),
    ]


# ------------------------------------------------------------------ on the client
def _default_client():
    try:
        from distributed import default_client

        return default_client()
    except (ImportError, ValueError):
        return None


def _name_workers(addresses: list[str], total: int) -> str:
    shown = ", ".join(sorted(addresses)[:SHOWN_WORKERS])
    more = len(addresses) - SHOWN_WORKERS
    return f"{len(addresses)} of {total} workers: {shown}" + (
        f" and {more} more" if more > 0 else ""
    )


_WHY = {
    "missing": "it does not exist there",
    "missing-written": "a probe file this machine wrote there is not there for them",
    "different": "they see different content at that path",
    "client-missing": "a probe file they wrote there does not reach this machine",
    "client-different": "a probe file they wrote there reads back different here",
}


def check_locations(
    targets: list[ProbeTarget], client=None, timeout: float | None = -1.0
) -> dict[str, Any] | None:
    """Probe ``targets`` on every worker of ``client`` (default: the current distributed
    client); raise :class:`VisibilityError` (one line) when a worker cannot see one, and
    :class:`pipeline.runtime.liveness.WorkerTimeoutError` (one line naming it) when a worker
    does
    not answer within ``timeout`` s (default: the run's ``cluster.worker_timeout``;
    None: wait for ever).

    Every probe file has a unique name (``.kpca-probe-<time>-<random>.<who>``) and is
    removed in any case (refusal, timeout, error); stale ones a killed probe left are
    removed first. Returns what was probed (``workers``, ``targets``, ``ms``), or None
    without a distributed client (nothing to probe: dask runs in this process).
    """
    from .liveness import (
        WorkerTimeoutError,
        activity,
        current_timeout,
        run_on_workers,
        silent_message,
    )

    client = client if client is not None else _default_client()
    if client is None:
        logger.info(
            "visibility probe: no Dask cluster (this process computes): nothing to probe"
        )
        return None
    if timeout == -1.0:
        timeout = current_timeout()
    t0 = time.perf_counter()
    probe = _Probe(targets, new_token())
    with activity("visibility probe"):
        try:
            mine = probe.client_side()
            looks, silent = run_on_workers(
                client, worker_look, targets, probe.token, timeout=timeout
            )
            if silent:
                raise WorkerTimeoutError(silent_message(silent, "visibility probe", timeout))
            probe.answered = sorted(looks)
            probe.compare(looks, mine)
        finally:
            _clean(
                client, targets, probe.token, probe.client_files, probe.created, probe.answered
            )
    ms = 1e3 * (time.perf_counter() - t0)
    total = len(probe.answered)
    if probe.failures:
        raise VisibilityError(_message(targets, probe.failures, probe.errors, total))
    logger.info(
        "visibility probe: %s seen by all %d workers (%.0f ms)",
        ", ".join(t.role for t in targets),
        total,
        ms,
    )
    return {"workers": total, "targets": [t.role for t in targets], "ms": ms}


class _Probe:
    """One probe's state on the client: the files and folders it made (removed in any
    case), the workers that answered, and what each could not see."""

    def __init__(self, targets: list[ProbeTarget], token: str):
        self.targets, self.token = targets, token
        self.created: list[Location] = []
        self.client_files: list[tuple[Location, Location]] = []
        self.failures: dict[str, dict[str, list[str]]] = {}  # role -> why -> workers
        self.errors: dict[str, str] = {}
        self.answered: list[str] = []

    def client_side(self) -> dict[str, str]:
        """Write this machine's probe file in each written target (creating its folders;
        stale probes removed first); the signature of each read target, by role."""
        mine: dict[str, str] = {}
        for t in self.targets:
            loc = t.loc
            if t.write:
                self.created += create_folders(loc)
                remove_stale_probes(loc)
                f = probe_file(loc, self.token, "client")
                self.client_files.append((loc, f))  # before writing: cleaned in any case
                write_text(f, self.token)
            else:
                mine[t.role] = signature(loc)
        return mine

    def compare(self, looks: dict[str, Any], mine: dict[str, str]) -> None:
        """Record, per target, the workers whose look differs from this machine's."""
        for addr, seen in sorted(looks.items()):
            if isinstance(seen, BaseException):
                for t in self.targets:
                    self._fail(t.role, "error", addr)
                self.errors.setdefault("probe", describe_exception(seen))
                continue
            for t, s in zip(self.targets, seen):
                why = self._why(t, s, mine)
                if why == "error":
                    self.errors.setdefault(t.role, s["error"])
                if why is not None:
                    self._fail(t.role, why, addr)

    def _why(self, t: ProbeTarget, s: dict, mine: dict[str, str]) -> str | None:
        """Why a worker's look ``s`` at ``t`` fails (a key of ``_WHY``, or ``error``)."""
        why = s.get("problem")
        if why is None and not t.write and s["signature"] != mine[t.role]:
            why = "missing" if s["signature"] == "missing" else "different"
        if why is None and t.write:
            text = read_text(probe_file(t.loc, self.token, s["wrote"]))
            if text != f"{self.token}:{s['wrote']}":
                why = "client-missing" if text is None else "client-different"
        return why

    def _fail(self, role: str, why: str, addr: str) -> None:
        self.failures.setdefault(role, {}).setdefault(why, []).append(addr)


def _clean(client, targets, token, client_files, created, answered) -> None:
    """Remove every probe file of ``token``: the workers that answered remove their own
    (bounded wait), then this machine removes its own and whatever of the token it sees
    (an object store, a shared disk: also a silent worker's), then the folders it made."""
    from .liveness import CLEANUP_TIMEOUT, run_on_workers

    if answered and any(t.write for t in targets):
        try:
            _, silent = run_on_workers(
                client, worker_clean, targets, token, timeout=CLEANUP_TIMEOUT, workers=answered
            )
            if silent:
                logger.debug("probe clean-up: no answer from %s", ", ".join(silent))
        except Exception as exc:  # noqa: BLE001 - housekeeping
            logger.debug("probe clean-up on the workers: %s", exc)
    for loc, f in client_files:
        try:
            remove_probe_file(loc, f)
            # what a worker wrote that it could not remove itself (seen only from here)
            if not loc.is_local:
                for key in loc.fs.glob(f"{loc.fs_path.rstrip('/')}/{PROBE_PREFIX}{token}.*"):
                    remove_probe_file(loc, loc.child(os.path.basename(key)))
            else:
                for q in loc.local_path.glob(f"{PROBE_PREFIX}{token}.*"):
                    remove_probe_file(loc, loc.child(q.name))
        except Exception as exc:  # noqa: BLE001 - housekeeping
            logger.debug("probe clean-up of %s: %s", f, exc)
    remove_created(created)


def _inside(url: str, other: str) -> bool:
    return url.rstrip("/").startswith(other.rstrip("/") + "/")


def _message(targets, failures, errors, total) -> str:
    parts = []
    # a folder inside another that failed the same way says nothing new (work in output)
    targets = [
        t
        for t in targets
        if not any(
            o.role in failures and o.write and _inside(t.url, o.url) and o is not t
            for o in targets
        )
    ]
    for t in targets:
        for why, addrs in failures.get(t.role, {}).items():
            reason = (
                f"the probe failed there ({errors.get(t.role) or errors.get('probe')})"
                if why == "error"
                else _WHY[f"{why}-written" if t.write and why == "missing" else why]
            )
            parts.append(f"{t.role} {t.url} ({_name_workers(addrs, total)}: {reason})")
    roles = [t.role for t in targets if t.role in failures]
    what = roles[0] if len(roles) == 1 else ", ".join(roles[:-1]) + " and " + roles[-1]
    return (
        f"the Dask workers cannot see the run's {what}: {'; '.join(parts)}; the workers do "
        f"not share this machine's files: put the {what} on storage every worker shares "
        "(the same path on a shared filesystem) or use an object store URL (s3://, gs://, "
        "az://) with its storage_options."
    )


def check_visibility(cfg, client=None) -> dict[str, Any] | None:
    """Probe the run's input (and an update's base run), output and work folder on every
    worker (see :func:`check_locations`); refuses with one line when a worker cannot see
    one."""
    return check_locations(run_targets(cfg), client)
