"""Placeholder until the Prefect flows land: run the stages as plain calls."""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.run import RunSummary, run_pipeline


def run_flow_or_plain(cfg: PipelineConfig) -> RunSummary:
    return run_pipeline(cfg)
