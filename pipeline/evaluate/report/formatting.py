"""Numbers, labels and tables as the plots and report.md print them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["fmt_num", "kernel_label", "md_table", "pct"]


def kernel_label(kernel: dict[str, Any] | None) -> str:
    """``rbf (gamma=0.0457)``: the kernel's name and the parameters it uses."""
    if not kernel:
        return "kernel PCA"
    name = kernel.get("name", "kernel")
    params = [
        f"{p}={fmt_num(kernel[p])}"
        for p in ("gamma", "degree", "coef0")
        if kernel.get(p) is not None and not (p != "gamma" and name in ("rbf", "laplacian"))
    ]
    return f"{name} ({', '.join(params)})" if params else str(name)


def fmt_num(v: Any) -> str:
    """Three significant digits; scientific notation outside [1e-4, 1e5); ``—`` for None."""
    if v is None:
        return "—"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    v = float(v)
    if v == 0 or 1e-4 <= abs(v) < 1e5:
        return f"{v:.3g}"
    return f"{v:.2e}"


def pct(v: Any) -> str:
    """A fraction as a percentage with two decimals; ``—`` for None."""
    return "—" if v is None else f"{100 * float(v):.2f}%"


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)
