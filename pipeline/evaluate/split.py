"""The seeded train/test split drawn before fitting (``<out>/split``)."""

from __future__ import annotations

import logging
from typing import Any

import dask.array as da
import numpy as np

from ..config import EvaluateConfig
from ..errors import EvaluationError

logger = logging.getLogger("pipeline.evaluate")

__all__ = ["make_split"]


def make_split(
    labels: Any, test_fraction: float = 0.2, *, random_state: int = 0, stratify: bool = True
) -> Any:
    """Seeded train/test split: 1 = training row, 0 = held-out row.

    Parameters
    ----------
    labels : array of shape (n_samples,), numpy or dask
        Integer class codes (negative codes are not allowed).
    test_fraction : float in (0, 1)
    random_state : int
    stratify : bool
        numpy labels: every class with at least two rows gets
        ``round(test_fraction * n_c)`` held-out rows (at least one, and at
        least one training row is always left). dask labels: each row is
        held out with probability ``test_fraction`` from a generator seeded by
        ``(random_state, chunk index)``: no pass over the labels, stratified
        only in expectation, and dependent on the chunking.

    Returns
    -------
    split : uint8 array of shape (n_samples,) (dask in, lazy dask out)
    """
    EvaluateConfig(test_fraction=test_fraction)  # same message as the config
    if isinstance(labels, da.Array):

        def _block(y: np.ndarray, block_info: Any = None) -> np.ndarray:
            idx = block_info[0]["chunk-location"][0] if block_info else 0
            rng = np.random.default_rng([random_state, idx])
            return (rng.random(y.shape[0]) >= test_fraction).astype(np.uint8)

        return labels.map_blocks(_block, dtype=np.uint8)
    y = np.asarray(labels)
    if y.ndim != 1:
        raise EvaluationError(f"labels must be 1-D; got shape {y.shape}")
    n = y.shape[0]
    if n < 2:
        raise EvaluationError(f"a train/test split needs at least 2 labelled rows; got {n}")
    rng = np.random.default_rng(random_state)
    split = np.ones(n, dtype=np.uint8)
    groups = [np.flatnonzero(y == c) for c in np.unique(y)] if stratify else [np.arange(n)]
    for idx in groups:
        if idx.size < 2:
            continue  # a singleton class stays in training
        n_test = round(test_fraction * idx.size)
        n_test = min(max(n_test, 1), idx.size - 1)
        split[rng.permutation(idx)[:n_test]] = 0
    if split.all():  # every class was a singleton
        split[rng.integers(n)] = 0
    return split
