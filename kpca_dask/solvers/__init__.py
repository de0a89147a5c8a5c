"""Eigensolvers for the centred kernel matrix.

* :func:`dense_eigh` -- the whole matrix in memory, ``scipy.linalg.eigh``.
* :func:`randomized_eigh` -- block Krylov or subspace iteration on the implicit
  operator, one pass over the kernel blocks per product, Nyström finish.

Both return an :class:`EigResult` with eigenvalues in descending order,
orthonormal eigenvectors with deterministic signs, and the relative residuals
``||Kc v - lambda v|| / lambda`` of every returned pair.
"""

from ._common import EigResult, deterministic_signs, drop_nonpositive
from .dense import dense_eigh
from .randomized import randomized_eigh

__all__ = ["EigResult", "deterministic_signs", "drop_nonpositive", "dense_eigh", "randomized_eigh"]
