"""``kpca update RUN NEW_DATA``: a new run (version n+1) from a published run and a batch.

run.py walks the update's stages in order, one module each:

    setup.py (the config) -> base.py (the base run verified, its lineage)
    -> drift.py (the drift report, drift_report.py; the action) -> model.py (the new
    model) -> project.py (the union's embedding) -> the manifest and the publish

Used from outside through the names below (imported on first use, PEP 562);
tests/test_layers.py checks it.
"""

from __future__ import annotations

from types import ModuleType

from pipeline._lazy_api import lazy_api

#: the public name -> the module of this package that defines it ("module:attr" when the
#: module names it differently; never a module's name, which its import would rebind)
API: dict[str, str] = {
    "run_update": "run",
    "update_config": "run",
    "UPDATE_REGISTRY": "run",
    "UpdateError": "run",
    "default_output": "run",
    "latest_run": "setup",
}

__all__ = list(API)


def _module(module: str) -> ModuleType:
    """This package's module ``module``, imported by name from a fixed list (no
    import of a computed name: tests/reliability/test_security.py)."""
    if module == "run":
        from . import run

        return run
    if module == "setup":
        from . import setup

        return setup
    raise AttributeError(f"module {__name__!r} has no module {module!r}")


__getattr__, __dir__ = lazy_api(__name__, API, _module)
