"""The project's tools, kept outside the library and its wheel: the side-by-side
benchmark (``bench``) and the Ray Train demo (``demo``), run from the repository root
as ``python -m benchmarks``.

They use air-transfer's public API, plus two documented hooks: ``air_transfer.node_agent``
(a node's agent, for its counters and pid) and ``air_transfer.core.direct_io``'s writer,
so that ``cp-direct``, the floor every ratio is taken against, writes to disk exactly as
the library's own writer does, with no transfer around it. Ray Tune's private names live
in ``bench.tune``.
"""
