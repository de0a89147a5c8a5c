"""Eigensolvers for the centred kernel matrix.

* :func:`dense_eigh` -- the whole matrix in memory, ``scipy.linalg.eigh``.
* :func:`randomized_eigh` -- block Krylov or subspace iteration on the implicit
  operator, one pass over the kernel blocks per product, deflated basis,
  Rayleigh-Ritz finish and an a-posteriori certificate (:func:`certify`).
* :func:`nystroem_eigh` -- Nyström kernel PCA: the centred covariance of the
  features ``k(X, Z) W^-1/2`` of m landmarks (:func:`select_landmarks`),
  linear in n (:mod:`.nystroem`).

The first two return an :class:`EigResult` with eigenvalues in descending order,
orthonormal eigenvectors with deterministic signs, and the relative residuals
``||Kc v - lambda v|| / lambda`` of every returned pair (the randomized solver
returns fewer pairs than asked when the kernel's numerical rank is lower).
"""

from ._common import EigResult, deterministic_signs, drop_nonpositive
from .dense import dense_eigh
from .landmarks import select_landmarks
from .nystroem import nystroem_eigh
from .randomized import randomized_eigh

__all__ = [
    "EigResult",
    "deterministic_signs",
    "drop_nonpositive",
    "dense_eigh",
    "randomized_eigh",
    "nystroem_eigh",
    "select_landmarks",
]
