"""The lazy package API of ``pipeline.output``, ``pipeline.runtime`` and ``pipeline.update``.

Each package's ``__init__`` names its public functions in ``API`` (name -> ``module`` or
``module:attribute``) and imports the module holding one only when it is first used, so
``import pipeline.output`` stays cheap and the packages can refer to each other without
import cycles. The modules are loaded through the package's own ``_module(name)``, a
fixed list of static imports (no import of a computed name:
tests/reliability/test_security.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def lazy_api(
    package: str, api: dict[str, str], load: Callable[[str], ModuleType]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__`` (PEP 562) for ``api``."""

    def __getattr__(name: str) -> Any:
        if name not in api:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = api[name].partition(":")
        value = getattr(load(module), attr or name)
        vars(sys.modules[package])[name] = value  # found directly from now on
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(api))

    return __getattr__, __dir__
