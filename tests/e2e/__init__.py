"""End to end: Ray Train and Tune runs, the scripts in ``examples/``, and smoke runs of
``python -m benchmarks bench`` and ``demo`` in subprocesses."""
