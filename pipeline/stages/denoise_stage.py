"""The denoise stage's declaration: pre-images of the embedding (``denoise.enabled``),
written next to it. Its body, :func:`~pipeline.embed.denoise.stage_denoise`, is
pipeline/embed/denoise.py."""

from __future__ import annotations

from typing import Any

from pipeline.embed.denoise import WRITTEN_ATTR, stage_denoise
from pipeline.output import run_layout
from pipeline.runner.registry import Stage

from .common import checksums

__all__ = ["DENOISE", "stage_denoise"]


def _fingerprint_denoise(cfg: Any, res: dict) -> dict:
    if not res.get("enabled"):
        return res
    g = run_layout(cfg).out.open_group("r")
    return {**res, "checksums": checksums(g, tuple(res["arrays"]))}


def _fresh_denoise(cfg: Any, inputs: dict, res: dict) -> str | None:
    g = run_layout(cfg).out.open_group("r")
    written = [a for a in g.attrs.get(WRITTEN_ATTR, []) if a in g]
    if written != list(res.get("arrays", [])):
        return "another run's denoised rows are in the run folder"
    if res.get("enabled") and checksums(g, tuple(written)) != res.get("checksums"):
        return "the denoised rows changed"
    return None


DENOISE = Stage(
    "denoise",
    stage_denoise,
    inputs=("ing", "split", "solved"),
    result="denoised",
    config=("denoise",),
    publishes=("<denoise.output_name>",),
    fingerprint=_fingerprint_denoise,
    fresh=_fresh_denoise,
    doc="pre-images of the embedding (denoise.enabled), written next to it",
)
