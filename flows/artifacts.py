"""Prefect artifacts of a run: a markdown summary, the spectrum as a table, links to the output.

Built from the published (verified) manifest and the run's spectrum arrays, so
a fully cached re-run reports the same numbers as the run that computed them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.output import MANIFEST, MODEL, PARQUET, REPORT, REPORT_MD, Location, RunLayout

__all__ = [
    "ARTIFACT_KEYS",
    "location_link",
    "spectrum_rows",
    "run_summary_markdown",
    "publish_run_artifacts",
    "publish_transform_artifacts",
]

#: Artifact keys (Prefect keeps every run's version under the same key).
ARTIFACT_KEYS = {
    "summary": "kpca-run-summary",
    "spectrum": "kpca-spectrum",
    "output": "kpca-output",
    "evaluation": "kpca-evaluation",
    "evaluation_table": "kpca-evaluation-table",
    "transform": "kpca-transform-summary",
    "transform_output": "kpca-transform-output",
}


def location_link(loc: Location | str) -> str:
    """A clickable URL for a local folder (``file://``) or the object-store URL itself."""
    loc = loc if isinstance(loc, Location) else Location(str(loc))
    return loc.local_path.as_uri() if loc.is_local else loc.url


def spectrum_rows(out: Location) -> list[dict[str, Any]]:
    """One row per component: eigenvalue, explained variance (and cumulative), residual."""
    g = out.open_group("r")
    ev = np.asarray(g["spectrum/eigenvalues"][...], dtype=float)
    evr = np.asarray(g["spectrum/explained_variance_ratio"][...], dtype=float)
    res = np.asarray(g["spectrum/residuals"][...], dtype=float)
    cum = np.cumsum(evr)
    return [
        {
            "component": i,
            "eigenvalue": float(ev[i]),
            "explained_variance_ratio": float(evr[i]),
            "cumulative_explained_variance": float(cum[i]),
            "residual": float(res[i]),
        }
        for i in range(len(ev))
    ]


def _fmt(v: Any, spec: str = ".4g") -> str:
    return "n/a" if v is None else format(v, spec)


def _kernel_text(kernel: dict[str, Any] | None) -> str:
    if not kernel:
        return "?"
    params = ", ".join(
        f"{k} {_fmt(v) if isinstance(v, float) else v}"
        for k, v in kernel.items()
        if k != "name"
    )
    return f"{kernel.get('name', '?')}" + (f" ({params})" if params else "")


def _links(out: Location, manifest: dict[str, Any]) -> list[tuple[str, str]]:
    lay = RunLayout(out)  # the output root; its published version holds the arrays
    links = [("output folder", out), (MANIFEST, lay.pointer), (f"{MODEL}/", lay.model)]
    if manifest["config"]["output"].get("parquet"):
        links.append((PARQUET, lay.parquet))
    if lay.report.child(REPORT_MD).exists():
        links.append((f"{REPORT}/{REPORT_MD}", lay.report.child(REPORT_MD)))
    return [(text, location_link(loc)) for text, loc in links]


def run_summary_markdown(
    out: Location,
    manifest: dict[str, Any],
    rows: list[dict[str, Any]],
    states: dict[str, str],
    timings: dict[str, float],
    cluster: str = "",
) -> str:
    """Data size, kernel, solver, explained variance, stage states and timings, links."""
    inp, model = manifest["input"], manifest["model"]
    ks = manifest.get("kernel_store") or {}
    cum = rows[-1]["cumulative_explained_variance"] if rows else 0.0
    first = rows[0]["explained_variance_ratio"] if rows else 0.0
    executed = [s for s, st in states.items() if st != "Cached"]
    lines = [
        "# Kernel PCA run",
        "",
        f"Output: [{out}]({location_link(out)}), manifest verified "
        f"(status `{manifest['status']}`, created {manifest['created']}).",
        "",
        "| | |",
        "|---|---|",
        f"| Data | {inp['n_rows']} rows x {inp['n_features']} features from "
        f"`{inp.get('source', {}).get('path')}`; {inp.get('dropped_rows', 0)} rows dropped; "
        f"{inp.get('rows_per_chunk')} rows per chunk |",
        f"| Input fingerprint | `{inp['fingerprint']}` |",
        f"| Kernel | {_kernel_text(model.get('kernel'))}; kernel matrix "
        f"{'materialised in zarr' if ks.get('materialized') else 'recomputed per pass'}"
        + (f" ({ks['reason']})" if ks.get("reason") else "")
        + " |",
        f"| Solver | {model.get('solver')}, {model.get('n_components')} components, "
        f"{model.get('n_passes')} passes, max residual {_fmt(model.get('max_residual'), '.2e')}"
        f"{'' if model.get('converged', True) else ', NOT converged'} |",
        f"| Explained variance | {100 * cum:.2f}% of the feature-space variance by "
        f"{len(rows)} components (first: {100 * first:.2f}%) |",
    ]
    if cluster:
        lines.append(f"| Dask | {cluster} |")
    ev = manifest.get("evaluation") or {}
    if ev.get("kpca_accuracy") is not None:
        lines.append(
            f"| Evaluation | held-out accuracy {_fmt(ev.get('kpca_accuracy'), '.4f')} "
            f"(kernel PCA) vs {_fmt(ev.get('pca_accuracy'), '.4f')} (linear PCA) |"
        )
    lines += [
        "",
        "## Stages",
        "",
        f"{len(states) - len(executed)} of {len(states)} stages cached"
        + (f"; ran: {', '.join(executed)}." if executed else "; nothing recomputed."),
        "",
        "| stage | state | seconds (this run) | seconds (when computed) |",
        "|---|---|---|---|",
    ]
    computed = manifest.get("timings") or {}
    for stage, state in states.items():
        lines.append(
            f"| {stage} | {state} | {timings.get(stage, 0.0):.2f} | "
            f"{_fmt(computed.get(stage), '.2f')} |"
        )
    lines += ["", "## Links", ""]
    lines += [f"- [{text}]({url})" for text, url in _links(out, manifest)]
    return "\n".join(lines) + "\n"


def publish_run_artifacts(
    out: Location,
    manifest: dict[str, Any],
    states: dict[str, str],
    timings: dict[str, float],
    evaluation: dict[str, Any] | None,
    cluster: str = "",
) -> dict[str, str]:
    """Create the run's Prefect artifacts; returns key -> artifact id."""
    from prefect.artifacts import (
        create_link_artifact,
        create_markdown_artifact,
        create_table_artifact,
    )

    published = RunLayout(out).out  # the version the pointer names
    rows = spectrum_rows(published)
    ids = {
        ARTIFACT_KEYS["summary"]: create_markdown_artifact(
            run_summary_markdown(out, manifest, rows, states, timings, cluster),
            key=ARTIFACT_KEYS["summary"],
            description=f"kernel PCA run at {out}",
        ),
        ARTIFACT_KEYS["spectrum"]: create_table_artifact(
            rows,
            key=ARTIFACT_KEYS["spectrum"],
            description="eigenvalues, explained variance and residual per component",
        ),
        ARTIFACT_KEYS["output"]: create_link_artifact(
            location_link(out),
            link_text=str(out),
            key=ARTIFACT_KEYS["output"],
            description="the run folder (manifest.json, model/, embedding, spectrum/)",
        ),
    }
    if evaluation:
        from pipeline.evaluate.report import artifact_summary

        report = published.child("report")
        summary = artifact_summary(evaluation, report_dir=location_link(report))
        ids[ARTIFACT_KEYS["evaluation"]] = create_markdown_artifact(
            summary["markdown"],
            key=ARTIFACT_KEYS["evaluation"],
            description=summary["description"],
        )
        if summary["table"]:
            ids[ARTIFACT_KEYS["evaluation_table"]] = create_table_artifact(
                summary["table"],
                key=ARTIFACT_KEYS["evaluation_table"],
                description="held-out accuracy by number of components",
            )
    return {k: str(v) for k, v in ids.items()}


def publish_transform_artifacts(
    model: str, input_path: str, res: dict[str, Any]
) -> dict[str, str]:
    """Create a transform run's artifacts (summary, link to the output)."""
    from prefect.artifacts import create_link_artifact, create_markdown_artifact

    md = (
        "\n".join(
            [
                "# Kernel PCA transform",
                "",
                "| | |",
                "|---|---|",
                f"| Model | `{model}` |",
                f"| Input | `{input_path}` |",
                f"| Rows | {res['rows']} |",
                f"| Components | {res['components']} |",
                f"| Output | [{res['output']}]({location_link(res['output'])}) |",
                f"| Seconds | {res['seconds']:.2f} |",
            ]
        )
        + "\n"
    )
    return {
        ARTIFACT_KEYS["transform"]: str(
            create_markdown_artifact(
                md, key=ARTIFACT_KEYS["transform"], description=f"embedding of {input_path}"
            )
        ),
        ARTIFACT_KEYS["transform_output"]: str(
            create_link_artifact(
                location_link(res["output"]),
                link_text=res["output"],
                key=ARTIFACT_KEYS["transform_output"],
                description="the embedded batch",
            )
        ),
    }
