"""A fitted model applied: the run's embedding (project.py, parquet.py), batch inference
``kpca transform`` (transform.py) and pre-images ``kpca denoise`` (denoise.py)."""
