"""The publish check of the solve stage: a fit is saved only when it is what was asked
for and its pairs meet the levels the solver certified them to (docs/solvers.md, "What
you can rely on")."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from kpca_dask import KernelPCA
from pipeline.config import PipelineConfig
from pipeline.errors import UserError

__all__ = ["CONSTANT_KERNEL", "SolveError", "certificate_of", "certificate_record", "check_fit"]

logger = logging.getLogger("pipeline")


class SolveError(UserError, ValueError):
    """The fit is not good enough to publish; the message says why and what to change."""


# One message for a constant centred kernel, whichever code path notices it: the solver
# (no positive eigenvalue at all, kpca_dask's ConstantKernelError) or check_fit (eigenvalues
# that are rounding noise). Which one fires depends on the CPU's rounding, not on the data.
CONSTANT_KERNEL = (
    "the centred kernel matrix is zero to rounding: the data are constant in feature "
    "space (every row identical, or kernel.gamma so large or small that the kernel is "
    "constant); check the input and kernel.gamma."
)


def check_fit(est: KernelPCA, cfg: PipelineConfig) -> None:
    """Refuse a fit that is not what was asked for, or not accurate, before it is saved.

    - fewer components than ``solver.n_components`` (the estimator drops
      non-positive eigenvalues with a warning; a run must not publish k-1
      columns to a downstream job that expects k);
    - a fit that carries a certificate (randomized solvers, exact or Nyström) is
      published on it: every pair must meet the level it was certified to
      (:func:`_check_certificate`), and ``solver.max_residual`` bounds the residuals
      of the pairs certified as vectors or subspaces, where a residual bounds the
      embedding's direction; "eigenvalue only" pairs (a flat tail, a cluster cut by
      ``n_components``) are held to their certified eigenvalue level, not to their raw
      residuals;
    - a fit without one (dense, arpack, Nyström's covariance method, an exact merge):
      ``solver.max_residual`` bounds every pair's residual.

    ``solver.max_residual: null`` turns the accuracy checks off (docs/solvers.md, "What
    you can rely on").
    """
    k_req, k = int(cfg.solver.n_components), int(est.n_components_)
    trace = float(getattr(est, "kernel_trace_", 0.0) or 0.0)
    # rounding noise of the kernel's dtype: float32 leaves ~1e-9 * trace of noise eigenvalues
    # on a constant kernel, float64 ~1e-16; a real signal is far above either bound
    noise = max(1e-10, 100 * float(np.finfo(np.dtype(cfg.solver.dtype)).eps))
    if trace > 0 and float(np.max(est.eigenvalues_)) <= noise * trace:
        raise SolveError(CONSTANT_KERNEL)
    if k < k_req:
        if cfg.kernel.name == "sigmoid":
            why = (
                f"the sigmoid kernel is not positive semi-definite and only {k} eigenvalues "
                "of the centred kernel matrix are clearly positive"
            )
        else:
            why = (
                f"the centred kernel matrix has only {k} clearly positive eigenvalues "
                "(duplicate rows or rank-deficient data)"
            )
        raise SolveError(
            f"solver.n_components={k_req} but {why}; set solver.n_components to {k} or less."
        )
    lim = cfg.solver.max_residual
    if lim is None:
        return
    cert = certificate_of(est)
    if cert is None:
        _check_residuals(est, None, lim, cfg)
        return
    _check_certificate(est, cert, cfg)
    _check_residuals(est, cert, lim, cfg)
    _log_eigenvalue_only(est, cert, lim)


#: what a pair of a certificate may be certified as (kpca_dask.solvers.certificate)
EIGENVALUE_ONLY = "eigenvalue only"


def certificate_of(est: KernelPCA) -> dict[str, Any] | None:
    """The certificate the fit is published on: ``solver_info_["certificate"]`` (under
    mixed precision the float64 recertification, the one the estimator's pairs come
    from), or None when the solve has none (dense, arpack, Nyström's covariance
    method, an escalation to dense, a merged update whose pairs replaced the fit's)."""
    info = getattr(est, "solver_info_", None) or {}
    cert = info.get("certificate")
    if not cert or "update" in info or "eigenvalue_ok" not in cert:
        return None
    return cert


def _pairs(est: KernelPCA, cert: dict[str, Any]) -> int:
    """How many of the certificate's pairs are the model's (the returned ones)."""
    return min(int(est.n_components_), len(cert["eigenvalue_ok"]))


def _met(cert: dict[str, Any], lam: np.ndarray, i: int) -> tuple[bool, bool]:
    """Whether pair ``i`` meets its eigenvalue level and its vector level. The flags
    are the certificate's; the eigenvalue's is checked again from its bound and level
    (``bound * lambda <= level * lambda + tau``, the rule the certificate applies)."""
    floor = float(cert.get("rounding_level", 0.0) or 0.0)
    b = float(cert["eigenvalue_bounds"][i])
    level = float(cert["eigenvalue_levels"][i])
    scale = abs(float(lam[i]))
    recheck = bool(b * scale <= (level * scale + floor) * (1 + 1e-9))
    return bool(cert["eigenvalue_ok"][i]) and recheck, bool(cert["vector_ok"][i])


def _angle_level(cert: dict[str, Any], lam: np.ndarray, i: int) -> float:
    """The level pair ``i``'s angle bound is held to: ``sqrt(tol)`` over the embedding
    scale ``sqrt(theta_a / theta_1)`` of its cluster (``a`` its first pair); ``tol``
    from its eigenvalue level (``tol`` for a vector, ``tol**0.75`` in a subspace)."""
    level = float(cert["eigenvalue_levels"][i])
    kind = cert["certified"][i] if "certified" in cert else "vector"
    tol = level ** (4.0 / 3.0) if kind == "subspace" else level
    clusters = list(cert.get("clusters") or [])
    a = clusters.index(clusters[i]) if i < len(clusters) else i
    top = abs(float(lam[0])) if len(lam) else 0.0
    weight = np.sqrt(abs(float(lam[a])) / top) if top > 0 else 1.0
    return float(np.sqrt(tol) / weight) if weight > 0 else float("inf")


def _what_to_change(est: KernelPCA, cfg: PipelineConfig) -> str:
    """The fixes for a fit whose certificate does not hold, in the config's terms."""
    s = cfg.solver
    if s.n_power_iter != "auto":
        more = (
            f"set solver.n_power_iter: auto ({s.n_power_iter} fixes the number of passes), "
            "raise solver.n_oversamples"
        )
    else:
        more = f"raise solver.max_iter (now {s.max_iter}) or solver.n_oversamples"
    dense = ", use eigen_solver: dense (n up to ~20k)"
    return (
        f"{more}{'' if est.eigen_solver_ == 'nystroem' else dense}, or ask for fewer components"
    )


def _check_certificate(est: KernelPCA, cert: dict[str, Any], cfg: PipelineConfig) -> None:
    """Refuse a fit with a pair that does not meet the level it was certified to: one
    line naming the first such pair, its bound and level, how many miss, what to change."""
    lam = np.asarray(est.eigenvalues_, dtype=np.float64)
    k = _pairs(est, cert)
    kinds = list(cert.get("certified") or ["vector"] * k)
    missed = [(i, *_met(cert, lam, i)) for i in range(k)]
    missed = [m for m in missed if not (m[1] and m[2])]
    if not missed:
        return
    i, eig_ok, _ = missed[0]
    if not eig_ok:
        what = (
            f"eigenvalue bound {float(cert['eigenvalue_bounds'][i]):.2g} (relative) above "
            f"its level {float(cert['eigenvalue_levels'][i]):.2g}"
        )
    else:
        what = (
            f"{'subspace' if kinds[i] == 'subspace' else 'eigenvector'} angle bound "
            f"{float(cert['angle_bounds'][i]):.2g} above its level "
            f"{_angle_level(cert, lam, i):.2g} (sqrt(tol) at the component's embedding scale)"
        )
    passes = int(getattr(est, "n_passes_", 0) or 0)
    after = f" after {passes} passes" if passes else ""
    raise SolveError(
        f"the {est.eigen_solver_} solver's certificate does not hold{after}: component "
        f"{i + 1} of {k} (certified as {kinds[i]!r}) has {what} ({len(missed)} of {k} "
        f"components miss their levels); {_what_to_change(est, cfg)}."
    )


def _check_residuals(
    est: KernelPCA, cert: dict[str, Any] | None, lim: float, cfg: PipelineConfig
) -> None:
    """``solver.max_residual`` on the residuals that bound a vector: every pair of a fit
    without a certificate, the pairs certified as vectors or subspaces of one with."""
    res = getattr(est, "residuals_", None)
    if res is None or not len(res):
        return
    res = np.asarray(res, dtype=np.float64)
    if cert is None:
        judged, kinds = list(range(len(res))), None
    else:
        kinds = list(cert.get("certified") or [])
        n = min(_pairs(est, cert), len(res), len(kinds))
        judged = [i for i in range(n) if kinds[i] != EIGENVALUE_ONLY]
    above = [i for i in judged if _above(est, res, i, lim, cert)]
    if not above:
        return
    i = max(above, key=lambda j: float(np.nan_to_num(res[j], nan=0.0)))
    what = "" if kinds is None else f" (certified as {kinds[i]!r})"
    if cert is None:
        fix = (
            "use eigen_solver: dense (n up to ~20k), set solver.n_power_iter: auto, raise "
            "solver.n_oversamples or solver.max_iter, or ask for fewer components"
            if est.eigen_solver_ != "dense"
            else "check the input (a dense solve is exact to rounding) or raise "
            "solver.max_residual"
        )
    else:
        fix = (
            "lower solver.tol (the solver stops when its certificate holds at tol) or "
            "raise solver.max_residual"
        )
    raise SolveError(
        f"the {est.eigen_solver_} solver's residual {float(res[i]):.2g} for component "
        f"{i + 1} of {len(res)}{what} exceeds solver.max_residual={lim:g}: the eigenpairs "
        f"are not as accurate as asked; {fix}."
    )


def _above(
    est: KernelPCA, res: np.ndarray, i: int, lim: float, cert: dict[str, Any] | None
) -> bool:
    """Whether pair ``i``'s residual ``r = residuals_ * lambda`` exceeds ``lim * lambda``
    plus the solver's rounding level (``tau = eps sqrt(n) ||Kc||``: no product in the
    kernel's dtype resolves less; float32 on a small tail eigenvalue reaches it)."""
    lam = abs(float(np.asarray(est.eigenvalues_, dtype=np.float64)[i]))
    floor = float((cert or {}).get("rounding_level", 0.0) or 0.0)
    r = float(np.nan_to_num(res[i], nan=0.0)) * lam
    return bool(r > lim * lam + floor)


def _log_eigenvalue_only(est: KernelPCA, cert: dict[str, Any], lim: float) -> None:
    """Say which pairs are published on their eigenvalue alone, to which level, and
    that ``solver.max_residual`` does not apply to them (one log line)."""
    k = _pairs(est, cert)
    kinds = list(cert.get("certified") or [])[:k]
    only = [i for i, kind in enumerate(kinds) if kind == EIGENVALUE_ONLY]
    if not only:
        return
    bounds = [float(cert["eigenvalue_bounds"][i]) for i in only]
    levels = [float(cert["eigenvalue_levels"][i]) for i in only]
    above = max(bounds) > lim
    logger.info(
        "solve: component(s) %s certified by their eigenvalues only (to %s relative; "
        "bounds up to %.2g%s); their vectors are some orthonormal basis of nearly the right "
        "space (docs/solvers.md, What you can rely on)%s",
        _ranges([i + 1 for i in only]),
        "/".join(f"{x:g}" for x in sorted(set(levels), reverse=True)),
        max(bounds),
        f", above solver.max_residual={lim:g}, which bounds certified vectors" if above else "",
        "; lower solver.tol to certify them tighter" if above else "",
    )


def _ranges(idx: list[int]) -> str:
    """``[10, 11, 12, 16]`` -> ``"10-12, 16"``."""
    out: list[str] = []
    for j in idx:
        if out and out[-1].split("-")[-1] == str(j - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{j}"
        else:
            out.append(str(j))
    return ", ".join(out)


def certificate_record(est: KernelPCA) -> dict[str, Any] | None:
    """What each published pair is certified as, its relative eigenvalue bound and the
    level it met (None: the solve has no certificate; docs/solvers.md)."""
    cert = certificate_of(est)
    if cert is None:
        return None
    k = _pairs(est, cert)

    def finite(xs: Any) -> list[float | None]:
        return [float(x) if np.isfinite(x) else None for x in list(xs)[:k]]

    return {
        "ok": bool(cert.get("ok", False)),
        "certified": list(cert.get("certified") or [])[:k],
        "eigenvalue_bounds": finite(cert["eigenvalue_bounds"]),
        "eigenvalue_levels": finite(cert["eigenvalue_levels"]),
    }
