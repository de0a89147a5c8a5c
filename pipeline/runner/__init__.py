"""How a run walks its stages: the stage registry's framework (registry.py: ``Stage``,
``Registry``, the config view a stage runs on), the typed results the stages pass on
(results.py), and ``kpca run`` without Prefect (run.py: the checks before anything is
written, the run lock and publishing transaction, the registered stages in order).

Nothing is imported here: pipeline/stages/ (the declarations) imports the framework, and
run.py imports the stages."""
