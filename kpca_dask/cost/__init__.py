"""A cost model of a fit: passes, tasks, flops, bytes moved, memory and predicted time.

:func:`estimate` prices a :class:`~kpca_dask.plan.FitPlan` on a cluster
(:class:`Cluster`: workers x threads, memory, network) with the constants of a
:class:`Machine` (GEMM and exp rates per core, memory bandwidth, scheduler
seconds per task, the round trip of one graph, network bandwidth), measured by
:func:`calibrate` (``kpca calibrate``) or given for a cluster. It models the
drivers as they are written (docs/scaling.md):

* exact randomized solver (:meth:`kpca_dask.gram.BlockKernelMatrix.product`):
  per pass, one task per upper block, one sum task per row block of each *wave*
  (``wave_tasks = max(128, 4 x threads)`` block tasks), one accumulator task per
  row block of each later wave (the waves' sums are added on the workers),
  and ``n_blocks`` tasks that persist the pass's block of Z; only final row
  blocks come back to the client: ``n x c x 8`` bytes per pass for ``c``
  columns (on the threaded scheduler every wave's partial sums from its first
  row to n are added in the caller). The Krylov basis (n x L) and its
  orthogonalisation live on the client.
* Nyström (:mod:`kpca_dask.solvers.nystroem`): one task per row block (or per
  8 blocks when fused), a tree of sums with fan-in 8, one m x c (randomized)
  or m x m (covariance) result to the client per pass.
* dense: every upper block comes to the client, then ``eigh`` there.

Nothing here runs a pass: the model reads the plan and the cluster only. The
number of passes of ``n_power_iter="auto"`` depends on the spectrum; it is an
input (``passes``), with a default taken from the fits measured in this project
(:data:`EXPECTED_PASSES`), and a finished fit can be re-priced with its own
``n_passes_`` (the manifest records both).

:func:`choose_execution` uses the model to run a small fit on the client's
threads when a distributed client is active but the cluster's per-task cost
exceeds what its cores would save.

The modules, each one concern (this package re-exports their public names):

* :mod:`.machine` -- :class:`Machine` (a node's constants, the built-in defaults) and
  where a calibration file lives (:func:`load_machine`);
* :mod:`.cluster` -- :class:`Cluster`, the cluster a fit is priced on;
* :mod:`.calibration` -- :func:`calibrate`, the measurements of ``kpca calibrate``;
* :mod:`.rates` -- core-seconds of kernel work from a machine's rates;
* :mod:`.estimation` -- :func:`estimate`: reading the input, then the solver's stages
  (:mod:`.price_exact`, :mod:`.price_nystroem`, :mod:`.price_dense`, one small function
  each, on what :mod:`.pricing` shares: the fit's shapes and constants);
* :mod:`.result` -- :class:`Estimate` and :class:`Stage`, what it returns;
* :mod:`.execution` -- :func:`choose_execution`: the cluster or the client's threads.
"""

from .calibration import FACTOR_SHAPE as FACTOR_SHAPE
from .calibration import FILL_LARGE_BYTES as FILL_LARGE_BYTES
from .calibration import ZARR_CHUNK_BYTES as ZARR_CHUNK_BYTES
from .calibration import _cpu_model as _cpu_model  # benchmarks report the CPU with it
from .calibration import calibrate
from .cluster import Cluster
from .estimation import estimate
from .execution import (
    EXECUTION_CONFIG,
    Execution,
    choose_execution,
    cluster_threads,
    fit_execution,
    transform_execution,
)
from .machine import Machine, default_calibration_path, load_machine
from .pricing import EXPECTED_PASSES as EXPECTED_PASSES
from .pricing import TASK_GRAPH_BYTES as TASK_GRAPH_BYTES
from .pricing import exact_waves
from .rates import EIGH_EFFICIENCY as EIGH_EFFICIENCY
from .rates import embed_seconds
from .result import Estimate, Stage

__all__ = [
    "Cluster",
    "Estimate",
    "Execution",
    "Machine",
    "calibrate",
    "choose_execution",
    "embed_seconds",
    "estimate",
    "exact_waves",
    "load_machine",
    "EXECUTION_CONFIG",
    "Stage",
    "default_calibration_path",
    "fit_execution",
    "transform_execution",
    "cluster_threads",
]
