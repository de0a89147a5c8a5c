"""The evaluate stage: read a run folder, classify, write ``report/metrics.json``."""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import dask.array as da
import numpy as np

from ..config import EvaluateConfig
from ..errors import EvaluationError
from ..preprocess import preprocess_report
from ..progress import Steps
from ..store import Location, atomic_write_json
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

logger = logging.getLogger("pipeline.evaluate")

__all__ = ["evaluate_run"]


def _location(out_dir: Any) -> Location:
    if isinstance(out_dir, Location):
        return out_dir
    return Location(str(out_dir))


def _sample_indices(n: int, m: int, seed: int, within: np.ndarray | None = None) -> np.ndarray:
    """Sorted seeded sample of at most ``m`` row indices (of ``within`` if given)."""
    pool = np.arange(n) if within is None else np.asarray(within)
    if pool.size <= m:
        return pool
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(pool, size=m, replace=False))


def _rows(z: Any, idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` (sorted) of a zarr array, reading only the chunks that hold them."""
    if idx.size == 0:
        return np.empty((0,) + tuple(z.shape[1:]), dtype=z.dtype)
    return np.asarray(z.oindex[(idx,) + (slice(None),) * (len(z.shape) - 1)])


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
    ``report.md`` (:func:`pipeline.report.write_report`).

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
    run = open_run(_location(out_dir), cfg)
    if isinstance(run, str):
        return _skipped(run)
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

    report = cfg.report if write_report is None else write_report
    steps = Steps("evaluate", 3 + (cfg.gamma_sweep is not None) + bool(report))
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

    metrics = Metrics(
        schema_version=METRICS_SCHEMA_VERSION,
        status="complete",
        created=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        data=data_summary(run, conf_k[run.k]),
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
        kpca_accuracy=kpca.accuracy,
        pca_accuracy=pca.accuracy,
        margin=kpca.accuracy - pca.accuracy,
        kpca=kpca,
        pca=pca,
        sweep=sweep,
        gamma_sweep=gamma_sweep,
        novelty=novelty,
        spectrum=spectrum(run, model),
        preprocess=preprocess_report(scaler),
        config=cfg.model_dump(mode="json"),
        timings=run.timings,
    ).to_json_dict()
    logger.info(
        "evaluate: kernel PCA accuracy %.4f vs linear PCA %.4f at k=%d (margin %+.4f)",
        kpca.accuracy,
        pca.accuracy,
        run.k,
        metrics["margin"],
    )

    if report:
        t = time.perf_counter()
        metrics["timings"]["total"] = t - t_start
        with steps.step("report"):
            draw_report(run, cfg, metrics, scores, title=title, description=description)
        metrics["timings"]["report"] = time.perf_counter() - t
    metrics["timings"]["total"] = time.perf_counter() - t_start
    Metrics.model_validate(metrics)  # what is written is what the schema says
    atomic_write_json(run.loc.child("report", "metrics.json"), metrics)
    return metrics


# ------------------------------------------------------------------ the steps
@dataclass
class RunFolder:
    """What the evaluate stage reads from a run folder (zarr arrays, opened lazily)."""

    loc: Location
    root: Any  # the run's zarr group
    z_emb: Any
    z_lab: Any
    classes: list[str]
    split: np.ndarray  # bool, True = training row (1 byte per row)
    emb: da.Array
    labels: da.Array
    timings: dict[str, float] = field(default_factory=dict)
    _z_X: Any = None

    @property
    def n(self) -> int:
        return int(self.z_emb.shape[0])

    @property
    def k(self) -> int:
        return int(self.z_emb.shape[1])

    @property
    def train_idx(self) -> np.ndarray:
        return np.flatnonzero(self.split)

    @property
    def test_idx(self) -> np.ndarray:
        return np.flatnonzero(~self.split)

    @property
    def z_X(self) -> Any:
        """The ingested features ``<out>/work/ingest.zarr/X``, checked against the rows."""
        if self._z_X is None:
            ingest_loc = _work_of(self.loc).child("ingest.zarr")
            try:
                z_X = ingest_loc.open_group("r")["X"]
            except Exception as exc:
                raise EvaluationError(
                    f"the linear PCA baseline reads the ingested features from "
                    f"{ingest_loc}/X, which cannot be opened ({exc}); keep the work "
                    "folder until evaluate has run"
                ) from exc
            if int(z_X.shape[0]) != self.n:
                raise EvaluationError(
                    f"{ingest_loc}/X has {z_X.shape[0]} rows but the "
                    f"embedding has {self.n}; the run folder is inconsistent"
                )
            self._z_X = z_X
        return self._z_X

    @contextlib.contextmanager
    def timed(self, step: str) -> Iterator[None]:
        t = time.perf_counter()
        yield
        self.timings[step] = time.perf_counter() - t


def _work_of(loc: Location) -> Location:
    """The ``work/`` folder of the run whose arrays are at ``loc``: beside the arrays, or
    -- ``loc`` a version of an output (``<out>/versions/<id>``) -- at the output's root."""
    url = loc.url.rstrip("/")
    head, _, _vid = url.rpartition("/")
    parent, _, name = head.rpartition("/")
    if name == "versions" and parent:
        return Location(parent, loc.storage_options).child("work")
    return loc.child("work")


def open_run(loc: Location, cfg: EvaluateConfig) -> RunFolder | str:
    """The run's embedding, labels and split, checked; or why evaluation is skipped."""
    try:
        root = loc.open_group("r")
    except Exception as exc:
        raise EvaluationError(
            f"{loc} is not a readable run folder (zarr group): {exc}"
        ) from exc
    # Membership tests look names up directly; listing the group would trip over
    # the plain work/ folder beside the arrays.
    if "embedding" not in root:
        raise EvaluationError(
            f"{loc} has no 'embedding' array; run the pipeline's project stage before evaluate"
        )
    if "labels" not in root:
        if cfg.enabled == "auto":
            return "the input has no label column"
        raise EvaluationError(
            f"evaluate.enabled is true but {loc} has no 'labels' array; set "
            "input.label_column, or set evaluate.enabled to 'auto' or false"
        )
    if "split" not in root:
        if cfg.enabled == "auto":
            return "the run holds out no rows (no 'split' array)"
        raise EvaluationError(
            f"{loc} has no 'split' array: held-out evaluation needs rows "
            "held out before fitting (the pipeline writes <out>/split when "
            "evaluation is enabled and labels exist)"
        )

    z_emb, z_lab, z_split = root["embedding"], root["labels"], root["split"]
    n = int(z_emb.shape[0])
    classes = [str(c) for c in z_lab.attrs.get("classes", [])]
    if z_lab.shape != (n,) or z_split.shape != (n,):
        raise EvaluationError(
            f"embedding has {n} rows but labels has shape {z_lab.shape} and "
            f"split {z_split.shape}; the run folder is inconsistent (re-run "
            "the project stage)"
        )
    split = np.asarray(z_split[...]).astype(bool)
    n_train = int(split.sum())
    if n_train == 0 or n_train == n:
        raise EvaluationError(
            f"the split holds {n_train} training and {n - n_train} "
            "held-out rows; both must be non-empty (check "
            "evaluate.test_fraction)"
        )
    emb = da.from_zarr(z_emb)
    labels = da.from_zarr(z_lab).rechunk({0: emb.chunks[0]})
    if not classes:
        top = int(labels.max().compute())
        classes = [str(i) for i in range(top + 1)]
    return RunFolder(loc, root, z_emb, z_lab, classes, split, emb, labels)


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
    test_idx = _sample_indices(run.n, cfg.max_novelty_points, seed + 1, run.test_idx)
    train_idx = _sample_indices(run.n, cfg.max_novelty_points, seed + 2, run.train_idx)
    with warnings.catch_warnings():  # rows of the ingest store: in the model's feature order
        warnings.filterwarnings("ignore", "X does not have valid feature names", UserWarning)
        test = np.asarray(model.score_samples(_rows(run.z_X, test_idx)), dtype=np.float64)
        train = np.asarray(model.score_samples(_rows(run.z_X, train_idx)), dtype=np.float64)
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
    cv_idx = _sample_indices(run.n, cfg.cv_max_rows, cfg.random_state + 3, run.train_idx)
    y = np.asarray(run.z_lab.oindex[cv_idx], dtype=np.int64)
    result = gamma_cv_sweep(
        _rows(run.z_X, cv_idx), y, model, gammas, ks, config=cfg, progress=steps
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

    idx = _sample_indices(run.n, cfg.max_scatter_points, cfg.random_state + 4)
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
