"""Pipeline stages: plain functions that read and write stores (no Prefect).

``pipeline.open_run(path, storage_options=None, version=None)`` is how a reader opens a
published run (docs/artifacts.md)."""


def __getattr__(name: str):
    if name == "open_run":
        from pipeline.output import open_run

        return open_run
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
