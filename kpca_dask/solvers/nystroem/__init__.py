"""Nyström kernel PCA: cost linear in n, a model of m landmarks.

Notation (docs/design.md, docs/nystroem.md). X (n x d) row blocks, landmarks Z
(m x d), ``C = k(X, Z)`` (n x m), ``W = k(Z, Z) = U S U^T``. Keep the
eigenvalues ``S > rtol * max(S)`` (m' of them) and set ``T = U S^-1/2``
(m x m'). The Nyström features are ``F = C T`` (n x m'), their column mean
``f = T^T c`` with ``c = C^T 1 / n`` (the mean kernel value at each landmark),
and the centred feature covariance (not divided by n, so that its
eigenvalues approximate those of the centred kernel matrix ``Kc``) is::

    Sigma = F_c^T F_c = T^T (C^T C - n c c^T) T.

``Sigma = P diag(lambda) P^T``; the top k pairs give the model: a new row x
embeds as ``k(x, Z) A - c^T A`` with ``A = T P_k`` (m x k), i.e. m kernel
evaluations and an m x k product, independent of n. With all n rows as
landmarks this is exact kernel PCA (Williams and Seeger 2001).

Neither F nor C is ever formed for all rows. Two ways to get the top
eigenpairs of Sigma, both one pass over X per product:

``method="covariance"``
    One pass forms ``C'^T C'`` (m x m) by a tree reduction over row blocks
    (``n m^2`` flops with a symmetric rank-k update), then ``eigh``. Exact on
    Sigma; cheapest for small m.
``method="randomized"``
    Block Krylov (:func:`~kpca_dask.solvers.randomized.randomized_eigh`) on
    the m' x m' operator ``Y -> Sigma Y``: each product recomputes C block by
    block and costs ``4 n m l`` flops (``l = k + oversamples``) plus the kernel
    evaluations, so several passes still cost less than ``n m^2`` once m is
    in the thousands. A final pass with the k leading vectors certifies them.

Centring without cancellation: before the covariance products every kernel
value is shifted by an estimate ``c0`` of the column means (from the landmark
sample), ``C' = C - 1 c0^T``; with ``delta = c - c0`` (exact, from the first
pass) ``C_c^T C_c = C'^T C' - n delta delta^T``. The shifted values have
(nearly) zero mean, so float32 products keep their accuracy even when all
kernel values are close to a constant.

Memory model: a task holds its row block of X, one strip of kernel values
(``strip_rows x m`` in the compute dtype, a few MB) and its partial sum
(``m x l`` float64, or ``m x m`` for the covariance method); partial sums are
added in a tree with fan-in 8. The driver holds m x m matrices (W, U, T) and
the m' x L Krylov basis. Nothing of size n x m or n x d exists anywhere;
graphs are lazy with deterministic names and run on any Dask scheduler.

The modules: :mod:`.basis` (W, T and the shift), :mod:`.passes` (one pass's block
products and their tree sum), :mod:`.worker_passes` (the same pass as one task per worker
on a distributed cluster, opt-in by the dask config ``kpca.nystroem-driver: workers``),
:mod:`.covariance` (Sigma as an operator and as sufficient statistics), :mod:`.eigh` (the
eigenpairs and the model), :mod:`.method` (the "auto" method's cost rule).
"""

from .basis import NystroemBasis, nystroem_basis
from .basis import default_w_rtol as default_w_rtol
from .covariance import FeatureCovariance, NystroemStatistics, batch_statistics
from .eigh import NystroemFit, nystroem_eigh, solve_statistics
from .method import NYSTROEM_METHODS
from .method import choose_method as choose_method
from .method import estimated_cost as estimated_cost
from .passes import SPLIT_EVERY as SPLIT_EVERY
from .passes import STRIP_BYTES as STRIP_BYTES
from .passes import block_stats_graph as block_stats_graph

__all__ = [
    "NystroemBasis",
    "nystroem_basis",
    "FeatureCovariance",
    "NystroemFit",
    "NystroemStatistics",
    "batch_statistics",
    "nystroem_eigh",
    "solve_statistics",
    "NYSTROEM_METHODS",
]
