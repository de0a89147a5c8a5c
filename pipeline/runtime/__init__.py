"""The runtime: the Dask cluster a command runs on and what watches it.

* cluster.py: connect to the configured cluster, or start a local one sized to this
  machine (``dask_client``);
* liveness.py: workers that stop answering named in one line (``activity``);
* visibility.py over probe_files.py: can every worker see the run's locations (checked
  before any stage);
* progress.py: progress bars in a terminal, quiet otherwise (``compute``, ``Steps``);
* sizing.py: ``kpca plan``, what a configured run will need before it runs;
* stage_calibration.py: each I/O stage's fixed part on a store (``kpca calibrate --store``).

Used from outside through the names below (imported on first use, PEP 562: importing
the package loads no cluster library); tests/test_layers.py checks it.
"""

from __future__ import annotations

from types import ModuleType

from pipeline._lazy_api import lazy_api

#: the public name -> the module of this package that defines it ("module:attr" when the
#: module names it differently; never a module's name, which its import would rebind)
API: dict[str, str] = {
    "dask_client": "cluster",
    "release_worker_memory": "cluster",
    "activity": "liveness",
    "check_visibility": "visibility",
    "check_locations": "visibility",
    "transform_targets": "visibility",
    "missing_folders": "visibility",
    "remove_created": "visibility",
    "PROBE_PREFIX": "probe_files",
    "remove_stale_probes": "probe_files",
    "new_token": "probe_files",
    "remove_probe_file": "probe_files",
    "compute": "progress",
    "Steps": "progress",
    "show_progress": "progress",
    "plan_run": "sizing",
    "configured_cluster": "sizing",
    "measure_stage_seconds": "stage_calibration",
}

__all__ = list(API)


def _module(module: str) -> ModuleType:
    """This package's module ``module``, imported by name from a fixed list (no
    import of a computed name: tests/reliability/test_security.py)."""
    if module == "cluster":
        from . import cluster

        return cluster
    if module == "liveness":
        from . import liveness

        return liveness
    if module == "probe_files":
        from . import probe_files

        return probe_files
    if module == "progress":
        from . import progress

        return progress
    if module == "sizing":
        from . import sizing

        return sizing
    if module == "stage_calibration":
        from . import stage_calibration

        return stage_calibration
    if module == "visibility":
        from . import visibility

        return visibility
    raise AttributeError(f"module {__name__!r} has no module {module!r}")


__getattr__, __dir__ = lazy_api(__name__, API, _module)
