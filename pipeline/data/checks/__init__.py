"""The pre-start checks' parts: findings (what a check reports), inputs (path, format,
NPY and zarr headers), tables (CSV and Parquet columns and types), rows (the sample and
the full pass). The entry points are in pipeline/data/validate.py."""
