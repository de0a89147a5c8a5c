"""Parameter rules: what a parameter may be, and one sentence when it is not.

Light on purpose (numpy and the exceptions only): the pipeline checks a config file's
values by these rules before it loads dask (pipeline/fitspec.py).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .exceptions import InvalidParameterError

__all__ = ["Rule", "int_range", "options", "real_range", "resolve_dtype", "validate_params"]


@dataclass(frozen=True)
class Rule:
    """One parameter's constraint, with the words used in the error message."""

    describe: str
    check: Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and np.isfinite(v)


def int_range(lo: int, hi: float = np.inf, *, allow: tuple = ()) -> Rule:
    hi_s = "inf)" if hi == np.inf else f"{hi}]"
    extra = "".join(f" or {a!r}" for a in allow)
    return Rule(
        f"an int in the range [{lo}, {hi_s}{extra}",
        lambda v: v in allow if not _is_int(v) else lo <= v <= hi,
    )


def real_range(
    lo: float, hi: float = np.inf, *, lo_open: bool = False, allow: tuple = ()
) -> Rule:
    left = "(" if lo_open else "["
    hi_s = "inf)" if hi == np.inf else f"{hi}]"
    extra = "".join(f" or {a!r}" for a in allow)

    def check(v):
        if not _is_real(v):
            return any(v is a or (isinstance(a, str) and v == a) for a in allow)
        return (v > lo if lo_open else v >= lo) and v <= hi

    return Rule(f"a float in the range {left}{lo}, {hi_s}{extra}", check)


def options(*choices: Any) -> Rule:
    return Rule(
        f"one of {sorted(map(str, choices))}", lambda v: isinstance(v, str) and v in choices
    )


def validate_params(
    owner: str, params: dict[str, Any], rules: dict[str, Rule | list[Rule]]
) -> None:
    """Raise InvalidParameterError naming the first parameter that breaks its rule."""
    for name, rule in rules.items():
        value = params[name]
        alts = rule if isinstance(rule, list) else [rule]
        if not any(r.check(value) for r in alts):
            desc = " or ".join(r.describe for r in alts)
            raise InvalidParameterError(
                f"The {name!r} parameter of {owner} must be {desc}. Got {value!r} instead."
            )


def resolve_dtype(dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise InvalidParameterError(
            "The 'dtype' parameter of KernelPCA must be 'float32' or 'float64'. "
            f"Got {dtype!r} instead."
        )
    return dt
