"""Prefect flows and the ``kpca`` command line (the top layer)."""
