"""The ``air-transfer`` command line: a run's checkpoints in node storage, listed,
verified, copied to and from any pyarrow or fsspec URI, and what dead writers left
there removed (``air-transfer --help``; ``docs/cli.md``).

The top layer: it may use every module below it, and nothing imports it. Parsing
needs no Ray: a command connects to the running cluster only when it runs
(``session``).
"""
