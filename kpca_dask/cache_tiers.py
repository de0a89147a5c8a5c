"""Which upper kernel blocks the partial cache tier keeps within a budget (the rule of
:meth:`kpca_dask.block_matrix.BlockKernelMatrix.plan_cache`, and of the cost model's
price of that tier: light, numpy only)."""

from __future__ import annotations

from collections.abc import Sequence

from .block_products import _strip_rows


def block_evaluations(ri: int, rj: int, diagonal: bool, itemsize: int) -> int:
    """Kernel entries a product evaluates for one upper block: an off-diagonal block
    whole, a diagonal block strip by strip from its diagonal on (the upper triangle
    plus the lower half of each strip's diagonal square)."""
    if not diagonal:
        return int(ri * rj)
    step = _strip_rows(ri, itemsize)
    return int(sum((min(a + step, ri) - a) * (ri - a) for a in range(0, ri, step)))


def blocks_to_cache(
    row_chunks: Sequence[int], itemsize: int, budget: float
) -> list[tuple[int, int]]:
    """The upper blocks the partial tier keeps within ``budget`` bytes (``itemsize``: the
    cached blocks' item size), in the order of the upper triangle.

    A kept block saves its evaluation at every later pass and costs its bytes (diagonal
    squares are kept whole), so the blocks are taken by evaluations saved per byte:
    off-diagonal blocks first (one evaluation per value kept), then diagonal ones (about
    half: a product evaluates only their upper triangle); in the order of the upper
    triangle within each kind, skipping a block that no longer fits (the last row block
    may be shorter). Used by :meth:`BlockKernelMatrix.plan_cache` and the cost model."""
    c = [int(x) for x in row_chunks]
    nb = len(c)
    pairs = [(i, j) for i in range(nb) for j in range(i, nb)]

    def saved_per_byte(p: tuple[int, int]) -> float:
        i, j = p
        return block_evaluations(c[i], c[j], i == j, itemsize) / max(1, c[i] * c[j])

    order = sorted(pairs, key=lambda p: -saved_per_byte(p))  # stable: triangle order
    room, kept = float(budget), set()
    for i, j in order:
        nbytes = c[i] * c[j] * itemsize
        if nbytes <= room:
            kept.add((i, j))
            room -= nbytes
    return [p for p in pairs if p in kept]
