"""The run folder's layout, as code: every path a run writes, named once.

This module is the code form of docs/artifacts.md. A run writes one output folder
(or object-store prefix) ``<out>/``; the stages, publishing, export, the flow's
result storage and the CLI address what is in it through :class:`RunLayout`, not
through string literals of their own.

A :class:`RunLayout` is built from the output location alone (it reads no other
configuration), so two runs to the same output agree on every path.
"""

from __future__ import annotations

from dataclasses import dataclass

from .store import Location

__all__ = [
    "CHECKSUMMED",
    "CHECKSUMMED_FILES",
    "DENOISED",
    "DRIFT_REPORT",
    "EMBEDDING",
    "FLOW_CACHE",
    "GROUP_FILE",
    "HOLDS",
    "INGEST_STORE",
    "KERNEL_STORE",
    "LEGACY",
    "LOCK",
    "MANIFEST",
    "METRICS",
    "MODEL",
    "PARQUET",
    "REPORT",
    "REPORT_MD",
    "ROW_ARRAYS",
    "RUN_NAMES",
    "SPECTRUM",
    "SPECTRUM_ARRAYS",
    "UPDATE",
    "VERSIONS",
    "WRITING",
    "WORK",
    "RunLayout",
    "output_location",
    "run_layout",
]

#: written last, atomically: a run is a result only when this says ``complete``; at an
#: output's root it is the pointer naming the published version (pipeline/output/versions.py)
MANIFEST = "manifest.json"
#: the run lock, present while a run writes (pipeline/output/lock.py)
LOCK = ".kpca-run.lock"
#: the folder of an output holding one complete result per writer (pipeline/output/versions.py)
VERSIONS = "versions"
#: holds other outputs' lineages keep on this output's versions and rows, one JSON file
#: per holder (pipeline/output/lineage.py writes them, retention in pipeline/output/versions.py
#: obeys)
HOLDS = "holds"
#: the fitted model (``kpca_dask.load(<out>/model)``)
MODEL = "model"
#: intermediate stores, kept so that a killed run resumes
WORK = "work"
INGEST_STORE = "ingest.zarr"
KERNEL_STORE = "kernel.zarr"
#: the Prefect tasks' persisted results (small JSON descriptors)
FLOW_CACHE = "flow-cache"
#: (n, k) embedding of every ingested row, and the spectrum arrays
EMBEDDING = "embedding"
SPECTRUM = "spectrum"
SPECTRUM_ARRAYS = (
    "spectrum/eigenvalues",
    "spectrum/explained_variance_ratio",
    "spectrum/residuals",
)
#: per-row arrays written by the split stage next to the embedding
ROW_ARRAYS = ("split", "labels", "ids")
#: optional Parquet copy of the embedding, and the evaluation report
PARQUET = "embedding.parquet"
REPORT = "report"
METRICS = "metrics.json"
REPORT_MD = "report.md"
#: the denoise stage's default array name (``denoise.output_name``)
DENOISED = "denoised"
#: the zarr group's own metadata file: the run folder is a zarr v3 group
GROUP_FILE = "zarr.json"
#: an update run's drift report (``kpca update``, pipeline/update/run.py)
UPDATE = "update"
DRIFT_REPORT = "drift.json"

#: arrays of the run group covered by the manifest's checksums (when present)
CHECKSUMMED = (EMBEDDING, *SPECTRUM_ARRAYS, "labels", "ids", "split")
#: folders of the run whose files are covered by the manifest's checksums (when present)
CHECKSUMMED_FILES = (PARQUET, REPORT, UPDATE)
#: top-level names a run writes (and may replace) in its output folder
RUN_NAMES = frozenset(
    {
        MANIFEST,
        GROUP_FILE,
        MODEL,
        EMBEDDING,
        PARQUET,
        SPECTRUM,
        *ROW_ARRAYS,
        REPORT,
        WORK,
        DENOISED,
        LOCK,
        UPDATE,
        VERSIONS,
        HOLDS,
    }
)

#: paths earlier versions wrote that nothing reads any more; a run ignores them
#: (they are inside ``work/``, so they are the run's own and go with it)
LEGACY = ("work/centre.zarr",)


#: root URLs of the outputs this process is writing, with the version each writes
#: (set by the writer's transaction, pipeline/runner/run.py)
WRITING: dict[str, str] = {}


@dataclass(frozen=True)
class RunLayout:
    """The locations of one output (each carries the output's storage options).

    ``root`` is the output folder the user named: the pointer ``manifest.json``, the
    lock, ``work/`` and ``versions/`` live there. ``out`` is the folder of the run's
    arrays: the version this process is writing (``version``), else the published
    version (resolved through the pointer, pipeline/output/versions.py), else -- nothing
    published yet -- the root itself.
    """

    root: Location
    version: str | None = None

    @property
    def out(self) -> Location:
        if self.version is not None:
            return self.root.child(VERSIONS, self.version)
        from .store import read_json

        m = self.root.child(MANIFEST)
        try:
            m.refresh()
            pointer = read_json(m) if m.exists() else None
        except Exception:  # noqa: BLE001 - unreadable: readers get the error from resolve
            pointer = None
        if isinstance(pointer, dict) and isinstance(pointer.get("version"), str):
            return self.root.child(VERSIONS, pointer["version"])
        return self.root

    @property
    def work(self) -> Location:
        return self.root.child(WORK)

    @property
    def ingest(self) -> Location:
        return self.work.child(INGEST_STORE)

    @property
    def kernel(self) -> Location:
        return self.work.child(KERNEL_STORE)

    @property
    def flow_cache(self) -> Location:
        return self.work.child(FLOW_CACHE)

    @property
    def model(self) -> Location:
        return self.out.child(MODEL)

    @property
    def manifest(self) -> Location:
        """The manifest of the run's version (the one being written, or the published)."""
        return self.out.child(MANIFEST)

    @property
    def pointer(self) -> Location:
        """The output's pointer: ``<root>/manifest.json``, what readers start from."""
        return self.root.child(MANIFEST)

    @property
    def lock(self) -> Location:
        return self.root.child(LOCK)

    @property
    def versions(self) -> Location:
        return self.root.child(VERSIONS)

    @property
    def parquet(self) -> Location:
        return self.out.child(PARQUET)

    @property
    def report(self) -> Location:
        return self.out.child(REPORT)

    @property
    def metrics(self) -> Location:
        return self.report.child(METRICS)

    def stores(self) -> dict[str, Location]:
        """The run's stores by name (``out``, ``work``, ``ingest``, ``kernel``, ``model``)."""
        out = self.out
        return {
            "out": out,
            "work": self.work,
            "ingest": self.ingest,
            "kernel": self.kernel,
            "model": out.child(MODEL),
        }


def run_layout(cfg) -> RunLayout:
    """The layout of the run ``cfg`` describes; reads ``output.path`` and
    ``output.storage_options`` (never the input's: two locations, two sets of options).
    The work folder is inside the output, so it shares the output's options. While this
    process writes the output (its transaction holds the lock), ``out`` is the version
    being written."""
    root = output_location(cfg.output.path, cfg.output.storage_options)
    return RunLayout(root, WRITING.get(root.url))


def output_location(path: str, storage_options: dict | None = None) -> Location:
    """The :class:`Location` of a run folder: its options apply to URLs only (a local
    folder takes none)."""
    return Location.at(str(path), storage_options)
