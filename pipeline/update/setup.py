"""``kpca update``'s config: the base run's own, with the batch as input, the new run as
output and ``update.base`` set (:func:`update_config`); the batch's columns matched to the
base run's by name and every row of the batch checked before anything starts. Part of
pipeline/update/run.py's stages (``pipeline.update.run`` re-exports these names)."""

from __future__ import annotations

import re
from typing import Any

from pipeline.config import PipelineConfig, absolute_path, check_storage_options, load_config
from pipeline.errors import UserError
from pipeline.output import Location, open_run
from pipeline.series.setup import prepare_batch


class UpdateError(UserError, ValueError):
    """An update that cannot be done as asked; the message says why and what to do."""


# --------------------------------------------------------------------- config
def default_output(base: Location, version: int) -> str:
    """``<base>-v<version>`` next to the base run (a trailing ``-vN`` replaced); in a
    series folder (runs named ``v1``, ``v2``...) the next ``v<version>``."""
    url = base.url.rstrip("/")
    head, _, name = url.rpartition("/")
    if re.fullmatch(r"v\d+", name):
        name = f"v{version}"
    else:
        name = re.sub(r"-v\d+$", "", name) + f"-v{version}"
    return f"{head}/{name}" if head else name


def latest_run(series: Location) -> Location | None:
    """The newest published run ``v<N>`` of a series folder (None: ``series`` is not one).

    A nightly deployment names the series (``/srv/kpca/runs/features``) instead of a run:
    each night updates the newest complete version into the next (docs/update.md).
    """
    from pipeline.output import MANIFEST

    if series.child(MANIFEST).exists() or not series.exists():
        return None
    versions = []
    for p in series.fs.ls(series.fs_path, detail=False):
        name = str(p).rstrip("/").rpartition("/")[2]
        m = re.fullmatch(r"v(\d+)", name)
        if m and series.child(name, MANIFEST).exists():
            versions.append((int(m.group(1)), name))
    if not versions:
        return None
    return series.child(max(versions)[1])


def _version(manifest: dict) -> int:
    return int((manifest.get("update") or {}).get("version", 1))


def update_config(
    base: str,
    new_data: str,
    output: str | None = None,
    *,
    policy: str | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    input_storage_options: dict[str, Any] | None = None,
    unlabelled: bool = False,
    no_ids: bool = False,
    ignore_extra: bool = False,
) -> PipelineConfig:
    """The update run's config: the base run's (from its verified manifest) with the batch
    as input, the new run as output and ``update.base`` set. Refuses an output that
    overlaps the base run.

    Local paths are made absolute here (the manifest and lineage never depend on the
    folder a command ran in). The batch's columns are matched to the base run's features
    by name, in any order (pipeline/data/features.py: ``match``, as ``kpca transform`` does):
    the new run reads the base's features in the base's order. A batch without the base's
    label (id) column is refused unless ``unlabelled`` (``no_ids``).

    ``storage_options``: fsspec options of the base run and of the new run when they are
    object-store URLs (default: the base run's own ``output.storage_options``);
    ``input_storage_options``: the batch's (default: the base run's input options)."""
    opts = check_storage_options(dict(storage_options or {}), "--storage-options")
    if input_storage_options is not None:
        check_storage_options(input_storage_options, "--input-storage-options")
    base, new_data = absolute_path(base), absolute_path(new_data)
    loc = Location.at(base, opts)
    newest = latest_run(loc)
    if newest is not None:  # a series folder of the earlier layout: v1, v2, ... beside
        loc = newest
    published = open_run(loc)  # the base's published version, verified
    manifest = published.manifest
    data = dict(manifest["config"])
    version = _version(manifest) + 1
    # a series is one output: without --output the update is a new version of RUN itself
    # (pipeline/series/, docs/update.md); the earlier layout's series folder gets v<n+1>
    if output is None:
        output = default_output(loc, version) if newest is not None else loc.url
    out = absolute_path(output)
    in_place = Location.at(out, opts).url.rstrip("/") == loc.url.rstrip("/")
    overwrite = overwrite or in_place
    data["input"] = {**data["input"], "path": new_data, "format": "auto"}
    if input_storage_options is not None:
        data["input"]["storage_options"] = dict(input_storage_options)
    data["output"] = {**data["output"], "path": out, "overwrite": bool(overwrite)}
    if storage_options is not None:
        data["output"]["storage_options"] = opts
    upd = dict(data.get("update") or {})
    # the base's published version itself (never modified): what the update reads, even
    # when the base output publishes another version meanwhile
    upd["base"] = published.location.url
    upd["base_storage_options"] = dict(loc.storage_options)
    if policy is not None:
        upd["policy"] = policy
    in_opts = data["input"].get("storage_options")
    upd["batch"] = prepare_batch(loc, manifest, new_data, in_opts, in_place=in_place)
    upd["unlabelled"], upd["no_ids"] = bool(unlabelled), bool(no_ids)
    data["update"] = upd
    # an update reports drift instead of evaluating; denoising belongs to full runs
    data["evaluate"] = {**data.get("evaluate", {}), "enabled": False}
    data["denoise"] = {**data.get("denoise", {}), "enabled": False}
    cfg = load_config(data)
    a = Location.at(out).url.rstrip("/") + "/"
    b = loc.url.rstrip("/") + "/"
    if not in_place and (a.startswith(b) or b.startswith(a)):
        raise UpdateError(
            f"the update's output {out} overlaps the base run {base}; a published run is "
            "never modified: choose another --output."
        )
    cfg = _match_batch(cfg, manifest, ignore_extra=ignore_extra)
    check_batch(cfg)
    return cfg


def check_batch(cfg: PipelineConfig) -> None:
    """Every row of the batch read once before anything starts (pipeline/data/validate.py:
    NaN/inf, text in a feature column, missing labels, missing or repeated ids, each with
    its row and column); ValidationError listing the problems."""
    from pipeline.data.validate import validate_input

    validate_input(cfg.input).raise_for_errors()


def _match_batch(cfg: PipelineConfig, manifest: dict, *, ignore_extra: bool) -> PipelineConfig:
    """``cfg`` with the batch's columns matched to the base run's by name: the base's
    features in its order, its id and label columns when the batch has them (refused,
    naming them, when it has not and the user did not say so)."""
    from pipeline.data.features import match
    from pipeline.data.readers import table_columns

    inp = manifest.get("input") or {}
    block = inp.get("features")
    if not block or block.get("selection") == "positions":
        return cfg  # an NPY/zarr base: columns by position, the width is checked later
    cols = table_columns(cfg.input)
    if cols is None:
        return cfg  # an NPY/zarr batch: by position (the drift stage checks the width)
    available, _ = cols
    base_label = block.get("label_column") or inp.get("label_column")
    base_id = block.get("id_column") or inp.get("id_column")
    m = match(
        {**block, "label_column": base_label, "id_column": base_id},
        cfg.input.path,
        available,
        ignore_extra=ignore_extra,
        what="update",
    )
    for col, found, flag, word in (
        (base_label, m.label_column, cfg.update.unlabelled, "--unlabelled"),
        (base_id, m.id_column, cfg.update.no_ids, "--no-ids"),
    ):
        if col is not None and found is None and not flag:
            kind = "label" if word == "--unlabelled" else "id"
            raise UpdateError(
                f"the batch {cfg.input.path} has no {kind} column {col!r} (the base run's); "
                f"add it, or pass {word} to add its rows without "
                f"{'labels' if kind == 'label' else 'ids'}."
            )
    new = cfg.model_copy(deep=True)
    new.input.columns = list(m.features)
    new.input.exclude_columns = None
    new.input.label_column = m.label_column
    new.input.id_column = m.id_column
    return new
