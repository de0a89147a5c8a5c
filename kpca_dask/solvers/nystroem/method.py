"""Which Nyström method a fit uses: ``nystroem_method="auto"``'s cost rule."""

from __future__ import annotations

__all__ = ["NYSTROEM_METHODS", "choose_method", "estimated_cost"]

NYSTROEM_METHODS = ("covariance", "randomized")


def estimated_cost(m: int, d: int, l: int, method: str, passes: int = 6) -> float:
    """Cost per row of X used by ``nystroem_method="auto"``, in units of about 0.01 ns
    (one float32 flop of the covariance update on this machine's two cores).

    Measured here (float32, d = 64, m = 2048, l = 40, two Dask threads; see
    docs/nystroem.md): a randomized pass costs 3.0 ns per row and landmark,
    of which 1.4 ns is the kernel evaluation (GEMM with the landmarks, clip,
    exp), and the covariance pass 22 ns. Hence per row and landmark: kernel
    ``kappa = 60 + 1.2 (d + 2)``, covariance ``kappa + m``, randomized
    ``passes * (kappa + 4 l)`` with about 6 passes (Krylov iterations to
    float32 tolerance plus the certification pass).
    """
    kappa = 60.0 + 1.2 * (d + 2)
    if method == "covariance":
        return m * (kappa + m)
    return m * passes * (kappa + 4.0 * l)


def choose_method(m: int, d: int, k: int | None, l: int) -> str:
    """ "auto": the covariance method when the cost model says it is cheaper (m below
    about 1700 for d = 64 and 16 components), when all components are wanted, or
    when the feature space is small next to the Krylov block."""
    if k is None or m <= 2 * l:
        return "covariance"
    if estimated_cost(m, d, l, "covariance") <= estimated_cost(m, d, l, "randomized"):
        return "covariance"
    return "randomized"
