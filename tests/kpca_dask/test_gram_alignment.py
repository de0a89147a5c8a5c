"""Block products do not depend on where their operands start in memory (issue 14).

A numpy array deserialised from a Dask message can start at any byte. numpy's matmul
hands only item-aligned operands to BLAS and multiplies the others with its own loop,
whose sums round differently: before the fix, the embedding's last bits depended on the
message layout (a run with its output on s3:// differed from the same run on local disk).
"""

from __future__ import annotations

import numpy as np
import pytest

from kpca_dask.gram import pair_products, stored_pair_products
from kpca_dask.kernels import RBFKernel


def _unaligned(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` whose data start one byte past an item boundary."""
    raw = np.zeros(a.nbytes + a.itemsize + 1, dtype=np.uint8)
    start = (-raw.ctypes.data) % a.itemsize + 1
    out = raw[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned and out.flags.c_contiguous
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_stored_block_products_ignore_operand_alignment(dtype):
    rng = np.random.default_rng(0)
    blk = rng.standard_normal((100, 100)).astype(dtype)
    zi, zj = rng.standard_normal((100, 29)), rng.standard_normal((100, 29))
    ref = stored_pair_products(blk, zi, zj, dtype)
    got = stored_pair_products(_unaligned(blk), _unaligned(zi), _unaligned(zj), dtype)
    for a, b in zip(ref, got):
        assert a.tobytes() == b.tobytes()
    # against an independent reference: the products themselves
    np.testing.assert_allclose(ref[0], blk.astype(np.float64) @ zj, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(ref[1], blk.astype(np.float64).T @ zi, rtol=1e-4, atol=1e-3)


def test_recomputed_block_products_ignore_operand_alignment():
    rng = np.random.default_rng(1)
    xi, xj = rng.standard_normal((100, 5)), rng.standard_normal((100, 5))
    zi, zj = rng.standard_normal((100, 29)), rng.standard_normal((100, 29))
    k = RBFKernel(gamma=0.3)
    ref = pair_products(k, xi, xj, zi, zj, "float64")
    got = pair_products(k, xi, xj, _unaligned(zi), _unaligned(zj), "float64")
    for a, b in zip(ref, got):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(1000, 700), (700, 1000), (1000, 1000)])
def test_stored_block_products_in_strips_match_the_whole_products(dtype, shape, monkeypatch):
    """Products of a stored block taken strip by strip (issue 17): strips smaller than the
    block, a ragged last strip and rectangular blocks give the products of the whole
    block, checked in float64 against numpy on the block itself."""
    import kpca_dask.block_products as bp

    # 300-row strips of a 700 or 1000-column block: several strips and a ragged last one
    monkeypatch.setattr(bp, "STORED_STRIP_BYTES", 300 * shape[1] * np.dtype(dtype).itemsize)
    rng = np.random.default_rng(3)
    blk = rng.random(shape).astype(dtype)
    zi, zj = rng.standard_normal((shape[0], 13)), rng.standard_normal((shape[1], 13))
    yi, yj = stored_pair_products(blk, zi, zj, dtype)
    assert yi.dtype == yj.dtype == dtype and yj.flags.c_contiguous
    B = blk.astype(np.float64)
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    scale_i = np.abs(B) @ np.abs(zj)
    scale_j = np.abs(B).T @ np.abs(zi)
    assert np.all(np.abs(yi - B @ zj) <= rtol * scale_i)
    assert np.all(np.abs(yj - B.T @ zi) <= rtol * scale_j)
