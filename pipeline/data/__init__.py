"""The run's input: read (readers/), checked before anything starts (checks/, validate.py,
scan.py, features.py, formats.py), and ingested into a zarr store of row chunks
(ingest.py, ingest_store.py); feature scaling (scaling.py), what later stages read back
(stage_data.py) and the demo datasets (demo_data.py)."""
