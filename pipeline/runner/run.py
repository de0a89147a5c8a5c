"""Running the pipeline: the run lock and publishing transaction, the checks before anything
is written, and ``run_pipeline`` calling the registered stages in order.

The stages themselves are declared once, in pipeline/stages/ (the registry); this
module's :func:`run_stages` walks the registry and hands each stage the results it
declared as inputs. ``run_pipeline`` is the plain, unorchestrated run (and the
reference the Prefect flow is tested against); the flow (flows/) walks the same
registry with one cached task per stage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline import stages
from pipeline.config import PipelineConfig, with_absolute_paths
from pipeline.data.readers import check_exists as _check_exists
from pipeline.output import (
    OUTPUT_MARK,
    WRITING,
    Location,
    RunError,
    RunLock,
    begin_run,
    check_not_complete,
    check_not_overlapping,
    check_output_folder,
    check_unlocked,
    migrate_output,
    run_layout,
)
from pipeline.runtime import activity, check_visibility, missing_folders, remove_created
from pipeline.stages import Registry, Stage

__all__ = [
    "RunSummary",
    "check_begin",
    "check_output",
    "run_lock",
    "run_pipeline",
    "run_stages",
    "stage_begin",
    "stage_locations",
]

logger = logging.getLogger("pipeline")


@dataclass
class RunSummary:
    out: str
    manifest: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    #: the published version's id (None: an output without versions)
    version: str | None = None

    @property
    def out_version(self) -> str:
        """The folder of the published version's arrays (``<out>/versions/<id>``)."""
        return f"{self.out.rstrip('/')}/versions/{self.version}" if self.version else self.out


def stage_locations(cfg: PipelineConfig) -> dict[str, Location]:
    """The run's stores by name (see :class:`pipeline.output.layout.RunLayout`)."""
    return run_layout(cfg).stores()


# ------------------------------------------------------------------ before a run
def check_output(cfg: PipelineConfig) -> None:
    """Refuse, before anything is written or un-published: an output folder holding files
    a run would replace that are not its own (or links), an output overlapping the input,
    and an input that does not exist."""
    raw = str(cfg.output.path).strip()
    bare = raw.removeprefix("file://").rstrip("/")
    if raw.rstrip("/") in ("", ".", "..") or bare in ("", ".", ".."):
        raise RunError(
            f"output.path {cfg.output.path!r} names no folder of its own (empty or "
            "'.'); set output.path to a new folder, e.g. kpca-output."
        )
    out = run_layout(cfg).root
    check_not_overlapping(out, [cfg.input.path])
    name = cfg.denoise.output_name
    check_output_folder(out, extra_names=(name, f"{name}_rows"))
    _check_exists(cfg.input)


def check_begin(cfg: PipelineConfig) -> None:
    """What :func:`stage_begin` refuses (a locked output, one that is not ours, a missing
    input, a complete run without overwrite), checked without writing anything: a run
    that is refused later (e.g. by the visibility probe) leaves no folder behind."""
    out = run_layout(cfg).root
    check_unlocked(out)
    check_output(cfg)
    check_not_complete(out, overwrite=cfg.output.overwrite)


def stage_begin(cfg: PipelineConfig) -> None:
    """Refuse to clobber a complete run (unless overwrite), to write where another run
    holds the lock, into a folder of the user's, or over the input -- and check that the
    input exists -- then start the version this run writes (nothing published changes
    until the run commits: pipeline/output/versions.py)."""
    lay = run_layout(cfg)
    check_unlocked(lay.root)
    check_output(cfg)
    check_not_complete(lay.root, overwrite=cfg.output.overwrite)
    begin_run(start_version(cfg), overwrite=True)


class RunTransaction(RunLock):
    """The run lock plus the publishing transaction (pipeline/output/versions.py).

    Taking it first refuses an output that is not ours to write (``check_output``), then
    migrates an output written by an earlier release's layout (pipeline/output/migrate.py), then
    removes versions left by writers that died and chooses the new version's id (the
    folder is created, seeded from the published version so that cached stages keep
    their artifacts, by :func:`start_version` once the run is past its refusals). While
    it is held, :func:`pipeline.output.layout.run_layout` points the stages at that version. On
    leaving without an error the version is published by one atomic write of the
    pointer (guarded: refused if another writer published meanwhile); a re-run whose
    every stage was cached publishes nothing. On an error the new version is removed and
    nothing is published: the previous result stays byte for byte as it was (a killed
    run's version is removed by the next run; the run resumes from ``work/``).
    """

    def __init__(self, cfg: PipelineConfig):
        super().__init__(run_layout(cfg).root)
        self.cfg = cfg
        self._created: list[Location] = []  # the output folders acquire() creates
        self.txn = None
        self.published: dict | None = None

    def acquire(self) -> RunTransaction:
        from pipeline.output import Transaction

        check_output(self.cfg)  # before the lock file or any folder is created
        self._created = missing_folders(self.out)
        super().acquire()
        try:
            # an output written by an earlier release's layout becomes its first published
            # version, its old top-level paths removed (one WARNING line): never left
            # serving the night before the upgrade (pipeline/output/migrate.py)
            migrate_output(self.out, lock=self)
            out_cfg = self.cfg.output
            self.txn = Transaction(
                self.out,
                self,
                keep=out_cfg.keep_versions,
                grace=out_cfg.retention_grace_hours * 3600,
            )
            self.txn.begin()
            WRITING[self.out.url] = self.txn.vid
            ACTIVE[self.out.url] = self.txn
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            WRITING.pop(self.out.url, None)
            ACTIVE.pop(self.out.url, None)
            if self.holder is not None and self.txn is not None and self.txn.started:
                if exc_type is None:
                    try:
                        self._publish()
                    except BaseException:  # refused (another writer published) or failed
                        self.txn.discard()
                        raise
                else:  # nothing is published; the previous result stays as it was
                    self.txn.discard()
                    # stopped (Ctrl-C, SIGTERM: not an Exception, e.g. KeyboardInterrupt or
                    # Prefect's TerminationSignal): the command's own one line says so
                    interrupted = not issubclass(exc_type, Exception)
                    (logger.debug if interrupted else logger.warning)(
                        "publish: the run %s; nothing was published, %s is as it was",
                        "was stopped" if interrupted else "failed",
                        self.out,
                    )
        finally:
            self.release()
            if exc_type is not None:  # refused before writing: no empty output folder left
                remove_created(self._created)

    @property
    def version(self) -> str | None:
        """The version published when the transaction ended: this run's, or (nothing
        changed, or nothing published) the one published before."""
        if self.published is not None:
            return self.published["version"]
        return (self.txn.base or {}).get("version") if self.txn is not None else None

    def _publish(self) -> None:
        from pipeline.output import MANIFEST, read_json

        txn = self.txn
        m = txn.location.child(MANIFEST)
        if txn.unchanged():
            txn.discard()  # every stage cached: the published run stays as it is
            logger.info("publish: nothing changed; %s stays as published", self.out)
            return
        if not m.exists() or read_json(m).get("status") != "complete":
            return  # stages that publish nothing (a partial registry): nothing to commit
        self.published = txn.commit()


#: the transactions this process holds, by output root URL
ACTIVE: dict[str, Any] = {}


def start_version(cfg: PipelineConfig) -> Location:
    """Create the version the run ``cfg`` writes (once; under its transaction): seeded
    from the published version. Returns its location."""
    lay = run_layout(cfg)
    txn = ACTIVE.get(lay.root.url)
    if txn is None:
        if lay.out != lay.root:  # a published version is never written in place
            raise RunError(
                f"{lay.root} holds published versions; write it under the run's lock "
                "(pipeline.runner.run.run_lock), which starts a new version."
            )
        return lay.root  # no transaction, nothing published: stages called on their own
    _mark_root(lay.root)
    return txn.start(seed=True)


def _mark_root(root: Location) -> None:
    """Mark the output root as written by kpca-dask (once)."""
    from kpca_dask.removal import MARKER_FILE
    from pipeline.output import mark_folder

    if not root.child(MARKER_FILE).exists():
        mark_folder(root, OUTPUT_MARK)


def run_lock(cfg: PipelineConfig) -> RunLock:
    """The output's run lock (a context manager): hold it around all the stages of a run.

    A second run to the same output is refused while it is held; the lock of a
    run that died on this host is broken automatically; one held from another
    host needs ``kpca unlock <out>`` (see pipeline/output/lock.py). It is also the run's
    publishing transaction: see :class:`RunTransaction`.
    """
    return RunTransaction(cfg)


def run_stages(
    registry: Registry,
    call: Callable[[Stage, dict[str, Any]], Any],
    *,
    timings: dict[str, float],
    t_run: float,
) -> dict[str, Any]:
    """Every stage of ``registry`` in order, through ``call(stage, arguments)``.

    A stage's arguments are the results of the stages it declared as inputs, plus the
    run facts it asked for (``timings``: this run's so far, with ``total``). Returns the
    results by name; ``timings`` gains one entry per stage.
    """
    results: dict[str, Any] = {}
    for stage in registry:
        args = {name: results[name] for name in stage.inputs}
        for fact in stage.run_info:
            if fact != "timings":
                raise ValueError(
                    f"stage {stage.name!r} asks for run fact {fact!r}; the runner "
                    "supplies only 'timings'"
                )
            timings["total"] = time.perf_counter() - t_run
            args["timings"] = dict(timings)
        t = time.perf_counter()
        with activity(f"stage {stage.name!r}"):  # named if a worker stops answering
            results[stage.result] = call(stage, args)
        timings[stage.name] = time.perf_counter() - t
    return results


def run_pipeline(cfg: PipelineConfig, registry: Registry | None = None) -> RunSummary:
    """Every stage in order, on the current Dask scheduler/client, holding the output's lock."""
    registry = stages.REGISTRY if registry is None else registry
    cfg = with_absolute_paths(cfg)  # a manifest never records a path relative to a cwd
    check_output(cfg)  # the output is ours to write and the input exists, then:
    check_visibility(cfg)  # every worker sees the input, output and work folder
    with run_lock(cfg) as txn:
        timings: dict[str, float] = {}
        t_run = time.perf_counter()
        t = time.perf_counter()
        stage_begin(cfg)
        timings["begin"] = time.perf_counter() - t
        results = run_stages(
            registry, lambda stage, args: stage(cfg, **args), timings=timings, t_run=t_run
        )
    return RunSummary(
        out=str(run_layout(cfg).root),
        manifest=results.get("manifest"),
        timings=timings,
        version=txn.version,
    )
