"""The pipeline's stages and :data:`REGISTRY`, their declarations in the order they run
(the framework, :class:`Stage` and :class:`Registry`, is pipeline/runner/registry.py).

    ingest -> split -> kernel -> solve -> project -> denoise -> evaluate -> export

Each stage is one module here, ``<name>_stage.py`` (the suffix keeps them apart from the
modules that do the work: pipeline/data/ingest.py, kernel.py, solve.py, project.py,
denoise.py, evaluate/, export.py), exporting its :class:`Stage` (``INGEST``, ``SPLIT``,
...), its stage function and its ``_fresh_*``/``_fingerprint_*`` helpers; what several
share is common.py. Each stage reads the config slice it declares (a
:class:`ConfigView`), takes the typed results of earlier stages and returns its own;
``_fresh_*`` say whether a cached result still describes the stores, ``_fingerprint_*``
add content checksums to a result. How the fit is set up (the kernel and solve stages'
slices, the estimator, the plan carried from one to the other) is pipeline/model/fitspec.py;
the hand-off from the kernel stage to the solve is kernel_stage.py (``planned_fit``).
"""

from __future__ import annotations

from pipeline.runner.registry import (
    LAYOUT_FIELDS,
    RUN_CONTROL,
    VOLATILE,
    ConfigSliceError,
    ConfigView,
    Registry,
    Stage,
    config_slice,
    identity,
)

from .common import _same as _same
from .common import _store_array as _store_array
from .common import _training_rows as _training_rows
from .common import checksums, evaluation_wanted, files_under
from .denoise_stage import DENOISE, stage_denoise
from .denoise_stage import _fingerprint_denoise as _fingerprint_denoise
from .denoise_stage import _fresh_denoise as _fresh_denoise
from .evaluate_stage import EVALUATE, stage_evaluate
from .evaluate_stage import _fingerprint_evaluate as _fingerprint_evaluate
from .evaluate_stage import _fresh_evaluate as _fresh_evaluate
from .export_stage import EXPORT, stage_export
from .export_stage import _fresh_export as _fresh_export
from .export_stage import _summary as _summary
from .export_stage import _without_options as _without_options
from .ingest_stage import INGEST, stage_ingest
from .ingest_stage import _fresh_ingest as _fresh_ingest
from .kernel_stage import KERNEL, planned_fit, stage_kernel
from .kernel_stage import _fresh_kernel as _fresh_kernel
from .kernel_stage import _kernel_input as _kernel_input
from .project_stage import _PROJECT_ARRAYS as _PROJECT_ARRAYS
from .project_stage import PROJECT, stage_project
from .project_stage import _fingerprint_project as _fingerprint_project
from .project_stage import _fresh_project as _fresh_project
from .solve_stage import MODEL_CHECKSUMS, SOLVE, stage_solve
from .solve_stage import _fingerprint_solve as _fingerprint_solve
from .solve_stage import _fresh_solve as _fresh_solve
from .split_stage import SPLIT, stage_split
from .split_stage import _fingerprint_split as _fingerprint_split
from .split_stage import _fresh_split as _fresh_split

__all__ = [
    "DENOISE",
    "EVALUATE",
    "EXPORT",
    "INGEST",
    "KERNEL",
    "LAYOUT_FIELDS",
    "MODEL_CHECKSUMS",
    "PROJECT",
    "REGISTRY",
    "RUN_CONTROL",
    "SOLVE",
    "SPLIT",
    "VOLATILE",
    "ConfigSliceError",
    "ConfigView",
    "Registry",
    "Stage",
    "checksums",
    "config_slice",
    "evaluation_wanted",
    "files_under",
    "identity",
    "planned_fit",
    "stage_denoise",
    "stage_evaluate",
    "stage_export",
    "stage_ingest",
    "stage_kernel",
    "stage_project",
    "stage_solve",
    "stage_split",
]

#: the full run's stages, in the order they run (``kpca update`` has its own,
#: pipeline/update/run.py, sharing INGEST)
REGISTRY = Registry([INGEST, SPLIT, KERNEL, SOLVE, PROJECT, DENOISE, EVALUATE, EXPORT])
