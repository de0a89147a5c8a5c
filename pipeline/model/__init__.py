"""The fit: how a config sets up the estimator (fitspec.py), the kernel matrix in zarr
(kernel_store.py), the solve (solve.py) and its publish check (fit_check.py)."""
