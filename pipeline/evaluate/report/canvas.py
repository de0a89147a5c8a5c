"""Figure sizes, the private Agg canvas, PNG bytes and how a report file is written."""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

from pipeline.output import Location

__all__ = ["DPI", "FIGSIZES", "png_size", "new_figure", "save_png", "write_bytes"]

#: dots per inch of every PNG
DPI = 100
#: figure sizes in inches (width, height); pixels = inches * DPI
FIGSIZES: dict[str, tuple[float, float]] = {
    "scree": (8.0, 4.5),
    "scatter": (7.0, 6.0),
    "accuracy_vs_components": (8.0, 4.5),
    "novelty": (8.0, 4.5),
    "gamma_cv": (8.0, 4.5),
}

KPCA_COLOUR, PCA_COLOUR = "#1f77b4", "#ff7f0e"


def png_size(name: str) -> tuple[int, int]:
    """(width, height) in pixels of the named plot."""
    w, h = FIGSIZES[name]
    return int(round(w * DPI)), int(round(h * DPI))


def new_figure(name: str) -> Any:
    """A private ``Figure`` of the named plot's size on an Agg canvas (no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZES[name], dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _png_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    # No bbox_inches="tight": it would change the pixel size per plot.
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def _as_location(where: Any) -> Location:
    return where if isinstance(where, Location) else Location(str(where))


def write_bytes(loc: Location, data: bytes) -> None:
    """Local: temporary file beside the target, then rename. Object stores: one PUT."""
    if loc.is_local:
        path = loc.local_path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; a report is for reading
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    else:
        with loc.fs.open(loc.fs_path, "wb") as f:
            f.write(data)


def save_png(fig: Any, target: Any) -> bytes:
    """The figure's PNG bytes, also written to ``target`` when it is not None."""
    data = _png_bytes(fig)
    if target is not None:
        write_bytes(_as_location(target), data)
    return data
