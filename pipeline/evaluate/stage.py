"""The evaluate stage: read a run folder, classify, write ``report/metrics.json``."""

from __future__ import annotations

import datetime
import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

from pipeline.data.scaling import preprocess_report
from pipeline.output import atomic_write_json
from pipeline.runtime import Steps

from ..config import EvaluateConfig
from .baseline import linear_pca_baseline
from .classify import (
    as_config,
    classification_metrics,
    confusions,
    resolve_classifier,
    resolve_sweep,
)
from .gamma import AUTO_GAMMA_FACTORS, GAMMA_KERNELS, gamma_cv_sweep
from .metrics import (
    METRICS_SCHEMA_VERSION,
    Baseline,
    Classification,
    ClassifierInfo,
    DataSummary,
    GammaSkipped,
    GammaSweep,
    Metrics,
    ModelSummary,
    Novelty,
    Spectrum,
    Sweep,
)
from .run_folder import RunFolder, as_location, open_run_folder, read_rows, sample_indices

logger = logging.getLogger("pipeline.evaluate")

__all__ = ["evaluate_run"]


def _skipped(reason: str) -> dict[str, Any]:
    logger.info("evaluate: skipped (%s)", reason)
    return {"schema_version": METRICS_SCHEMA_VERSION, "status": "skipped", "reason": reason}


def _quantiles(x: np.ndarray) -> dict[str, float] | None:
    if x.size == 0:
        return None
    qs = {
        "min": 0.0,
        "p05": 0.05,
        "p25": 0.25,
        "median": 0.5,
        "p75": 0.75,
        "p95": 0.95,
        "p99": 0.99,
        "max": 1.0,
    }
    return {name: float(np.quantile(x, q)) for name, q in qs.items()}


def evaluate_run(
    out_dir: Any,
    config: EvaluateConfig | dict[str, Any] | None = None,
    *,
    write_report: bool | None = None,
    title: str | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    """The evaluate stage: classify a run's embedding, write ``report/metrics.json``.

    Reads (docs/artifacts.md) ``<out>/embedding``, ``<out>/labels`` (with
    ``attrs["classes"]``), ``<out>/split`` (1 = training row),
    ``<out>/spectrum/*``, ``<out>/model`` (for ``score_samples`` and the
    gamma sweep) and ``<out>/work/ingest.zarr/X`` (for the linear PCA
    baseline). Writes ``<out>/report/metrics.json`` atomically and, unless
    ``config.report`` (or ``write_report``) is false, the plots and
    ``report.md`` (:func:`pipeline.evaluate.report.write_report`).

    Idempotent: re-running overwrites the report with the same numbers
    (every random choice is seeded by ``config.random_state``).

    Parameters
    ----------
    out_dir : str, Path or Location
        The run folder (local path or fsspec URL).
    config : EvaluateConfig or dict, optional
    write_report : bool, optional
        Override ``config.report``.
    title, description : str, optional
        Heading and a sentence about the data for report.md (e.g. the input path).

    Returns
    -------
    metrics : dict
        ``{"status": "skipped", "reason": ...}`` when evaluation is off, or
        'auto' and the run has no labels or no held-out rows (nothing is
        written then); otherwise the metrics written to metrics.json
        (:class:`~pipeline.evaluate.metrics.Metrics`).

    Raises
    ------
    EvaluationError
        ``enabled`` is true but labels or the split are missing, or the arrays
        disagree in length, or a side of the split is empty.
    """
    cfg = as_config(config)
    if cfg.enabled is False:
        return _skipped("evaluate.enabled is false")
    t_start = time.perf_counter()
    run = open_run_folder(as_location(out_dir), cfg)
    if isinstance(run, str):
        return _skipped(run)
    report = cfg.report if write_report is None else write_report
    steps = Steps("evaluate", 3 + (cfg.gamma_sweep is not None) + bool(report))
    measured = _measure(run, cfg, steps)
    metrics = _metrics(run, cfg, measured).to_json_dict()
    logger.info(
        "evaluate: kernel PCA accuracy %.4f vs linear PCA %.4f at k=%d (margin %+.4f)",
        measured.kpca.accuracy,
        measured.pca.accuracy,
        run.k,
        metrics["margin"],
    )
    if report:
        t = time.perf_counter()
        metrics["timings"]["total"] = t - t_start
        with steps.step("report"):
            draw_report(
                run, cfg, metrics, measured.scores, title=title, description=description
            )
        metrics["timings"]["report"] = time.perf_counter() - t
    metrics["timings"]["total"] = time.perf_counter() - t_start
    Metrics.model_validate(metrics)  # what is written is what the schema says
    atomic_write_json(run.loc.child("report", "metrics.json"), metrics)
    return metrics


@dataclass
class _Measured:
    """What the evaluate steps measured, before it becomes :class:`Metrics`."""

    kind: str
    model: Any
    scaler: Any
    kpca: Classification
    conf_k: dict[int, np.ndarray]
    pca: Baseline
    sweep: Sweep
    novelty: Novelty
    scores: tuple[np.ndarray, np.ndarray]
    gamma_sweep: GammaSweep | GammaSkipped | None


def _measure(run: RunFolder, cfg: EvaluateConfig, steps: Steps) -> _Measured:
    """The timed steps: both classifiers, the sweep, novelty scores, the gamma sweep."""
    kind = resolve_classifier(cfg.classifier, int(run.train_idx.size), cfg.sgd_min_rows)
    ks, skipped = resolve_sweep(cfg.sweep_components, run.k)
    logger.info(
        "evaluate: %d training / %d held-out rows, k=%d, classifier=%s, sweep=%s",
        run.train_idx.size,
        run.test_idx.size,
        run.k,
        kind,
        ks,
    )
    with run.timed("kpca_classifier"), steps.step("%s on the kernel PCA embedding", kind):
        kpca, conf_k = classify_embedding(run, cfg, kind, ks)
    model = load_model(run)
    scaler = getattr(model, "preprocess_", None)
    with run.timed("pca_baseline"), steps.step("linear PCA baseline, %s", kind):
        pca, conf_p = classify_linear_pca(run, cfg, kind, ks, scaler=scaler)
    sweep = accuracy_sweep(conf_k, conf_p, ks, skipped, pca.n_components)
    with run.timed("novelty"), steps.step("novelty scores"):
        novelty, scores = novelty_scores(run, model, cfg)
    gamma_sweep = None
    if cfg.gamma_sweep is not None:
        with run.timed("gamma_sweep"), steps.step("gamma cross-validation"):
            gamma_sweep = cross_validate_gamma(run, model, cfg, ks, steps=steps)
    return _Measured(
        kind, model, scaler, kpca, conf_k, pca, sweep, novelty, scores, gamma_sweep
    )


def _metrics(run: RunFolder, cfg: EvaluateConfig, m: _Measured) -> Metrics:
    """The metrics.json record of what was measured (timings without the report yet)."""
    model, kind = m.model, m.kind
    return Metrics(
        schema_version=METRICS_SCHEMA_VERSION,
        status="complete",
        created=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        data=data_summary(run, m.conf_k[run.k]),
        model=ModelSummary(
            kernel=model.kernel_.to_dict() if hasattr(model.kernel_, "to_dict") else {},
            n_components=run.k,
            eigen_solver=getattr(model, "eigen_solver_", None),
            gamma=getattr(model, "gamma_", None),
        ),
        classifier=ClassifierInfo(
            name=kind,
            C=cfg.C,
            standardize=cfg.standardize,
            max_iter=cfg.max_iter if kind != "sgd" else None,
            sgd_epochs=cfg.sgd_epochs if kind == "sgd" else None,
        ),
        n_components=run.k,
        kpca_accuracy=m.kpca.accuracy,
        pca_accuracy=m.pca.accuracy,
        margin=m.kpca.accuracy - m.pca.accuracy,
        kpca=m.kpca,
        pca=m.pca,
        sweep=m.sweep,
        gamma_sweep=m.gamma_sweep,
        novelty=m.novelty,
        spectrum=spectrum(run, model),
        preprocess=preprocess_report(m.scaler),
        config=cfg.model_dump(mode="json"),
        timings=run.timings,
    )


# ------------------------------------------------------------------ the steps
def classify_embedding(
    run: RunFolder, cfg: EvaluateConfig, kind: str, ks: list[int]
) -> tuple[Classification, dict[int, np.ndarray]]:
    """The classifier on kernel PCA: training rows vs held-out rows (embedded by the
    saved model's transform); confusion matrices by number of components."""
    s = run.split
    conf, info = confusions(
        run.emb[s], run.labels[s], run.emb[~s], run.labels[~s], ks, len(run.classes), cfg, kind
    )
    m = classification_metrics(conf[run.k], run.classes)
    return Classification(**m, n_components=run.k, converged=info["converged"]), conf


def classify_linear_pca(
    run: RunFolder, cfg: EvaluateConfig, kind: str, ks: list[int], *, scaler: Any = None
) -> tuple[Baseline, dict[int, np.ndarray]]:
    """The same classifier on linear PCA of the same rows, same k (capped at d), on the
    same features: scaled by the model's fitted scaling when it has one."""
    s = run.split
    X = da.from_zarr(run.z_X)
    if scaler is not None:
        X = scaler.transform(X)
    P_tr, P_te, pca_info = linear_pca_baseline(
        X[s], X[~s], run.k, random_state=cfg.random_state, memory_mb=cfg.baseline_memory_mb
    )
    k_pca = pca_info["n_components"]
    ks_pca = [x for x in ks if x <= k_pca]
    if k_pca not in ks_pca:
        ks_pca.append(k_pca)
    conf, info = confusions(
        P_tr, run.labels[s], P_te, run.labels[~s], ks_pca, len(run.classes), cfg, kind
    )
    m = classification_metrics(conf[k_pca], run.classes)
    return Baseline(
        **m,
        n_components=k_pca,
        converged=info["converged"],
        method=pca_info["method"],
        explained_variance_ratio=pca_info["explained_variance_ratio"],
    ), conf


def accuracy_sweep(
    conf_k: dict[int, np.ndarray],
    conf_p: dict[int, np.ndarray],
    ks: list[int],
    skipped: list[int],
    k_pca: int,
) -> Sweep:
    """Accuracy at each swept k for both embeddings (None where linear PCA has no k)."""

    def acc(conf: dict[int, np.ndarray], x: int) -> float | None:
        if x not in conf:
            return None
        c = conf[x]
        return float(np.trace(c) / c.sum()) if c.sum() else None

    sweep = Sweep(
        n_components=ks,
        kpca_accuracy=[acc(conf_k, x) for x in ks],
        pca_accuracy=[acc(conf_p, x) for x in ks],
        skipped=skipped,
    )
    if k_pca < max(ks):
        sweep.pca_max_components = k_pca
    return sweep


def load_model(run: RunFolder) -> Any:
    import kpca_dask

    return kpca_dask.load(run.loc.child("model").zarr_source())  # with its storage options


def novelty_scores(
    run: RunFolder, model: Any, cfg: EvaluateConfig
) -> tuple[Novelty, tuple[np.ndarray, np.ndarray]]:
    """``score_samples`` of sampled held-out and training rows; the share of held-out rows
    above the training rows' 99th percentile."""
    seed = cfg.random_state
    test_idx = sample_indices(run.n, cfg.max_novelty_points, seed + 1, run.test_idx)
    train_idx = sample_indices(run.n, cfg.max_novelty_points, seed + 2, run.train_idx)
    with warnings.catch_warnings():  # rows of the ingest store: in the model's feature order
        warnings.filterwarnings("ignore", "X does not have valid feature names", UserWarning)
        test = np.asarray(model.score_samples(read_rows(run.z_X, test_idx)), dtype=np.float64)
        train = np.asarray(model.score_samples(read_rows(run.z_X, train_idx)), dtype=np.float64)
    threshold = float(np.quantile(train, 0.99)) if train.size else None
    novelty = Novelty(
        n_test_scored=int(test.size),
        n_train_scored=int(train.size),
        test_quantiles=_quantiles(test),
        train_quantiles=_quantiles(train),
        train_p99=threshold,
        test_fraction_above_train_p99=(
            float(np.mean(test > threshold)) if threshold is not None and test.size else None
        ),
    )
    return novelty, (test, train)


def cross_validate_gamma(
    run: RunFolder, model: Any, cfg: EvaluateConfig, ks: list[int], steps: Steps | None = None
) -> GammaSweep | GammaSkipped:
    """Kernel coefficients compared by cross-validation on sampled training rows."""
    kname = getattr(model, "kernel", None)
    if not (isinstance(kname, str) and kname in GAMMA_KERNELS):
        logger.warning("evaluate: gamma_sweep skipped: kernel %r has no gamma", kname)
        return GammaSkipped(skipped=f"kernel {kname!r} has no gamma to tune")
    gammas = (
        sorted(float(model.gamma_) * f for f in AUTO_GAMMA_FACTORS)
        if cfg.gamma_sweep == "auto"
        else list(cfg.gamma_sweep)
    )
    cv_idx = sample_indices(run.n, cfg.cv_max_rows, cfg.random_state + 3, run.train_idx)
    y = np.asarray(run.z_lab.oindex[cv_idx], dtype=np.int64)
    result = gamma_cv_sweep(
        read_rows(run.z_X, cv_idx), y, model, gammas, ks, config=cfg, progress=steps
    )
    return GammaSweep(**result, fitted_gamma=float(model.gamma_))


def data_summary(run: RunFolder, confusion: np.ndarray) -> DataSummary:
    s = run.split
    counts = da.bincount(run.labels[s].astype(np.int64), minlength=len(run.classes)).compute()
    return DataSummary(
        n_rows=run.n,
        n_features=int(run.z_X.shape[1]),
        n_train=int(run.train_idx.size),
        n_test=int(run.test_idx.size),
        classes=run.classes,
        train_class_counts=[int(c) for c in counts],
        test_class_counts=[int(sum(r)) for r in confusion],
    )


def spectrum(run: RunFolder, model: Any) -> Spectrum:
    root = run.root
    if "spectrum/eigenvalues" in root and "spectrum/explained_variance_ratio" in root:
        ev = np.asarray(root["spectrum/eigenvalues"][...], dtype=np.float64)
        evr = np.asarray(root["spectrum/explained_variance_ratio"][...], dtype=np.float64)
    else:  # the model holds the same numbers
        ev = np.asarray(model.eigenvalues_, dtype=np.float64)
        evr = np.asarray(model.explained_variance_ratio_, dtype=np.float64)
    return Spectrum(eigenvalues=ev.tolist(), explained_variance_ratio=evr.tolist())


def draw_report(
    run: RunFolder,
    cfg: EvaluateConfig,
    metrics: dict[str, Any],
    scores: tuple[np.ndarray, np.ndarray],
    *,
    title: str | None,
    description: str | None,
) -> None:
    """The plots and report.md (matplotlib is imported only here)."""
    from .report import write_report

    idx = sample_indices(run.n, cfg.max_scatter_points, cfg.random_state + 4)
    emb = np.asarray(run.z_emb.oindex[idx, : min(2, run.k)], dtype=np.float64)
    lab = np.asarray(run.z_lab.oindex[idx], dtype=np.int64)
    write_report(
        run.loc,
        metrics,
        scatter=(emb, lab),
        novelty=scores,
        title=title,
        description=description,
    )
