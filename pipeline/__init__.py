"""Pipeline stages: plain functions that read and write stores (no Prefect)."""
