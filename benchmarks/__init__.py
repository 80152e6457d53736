"""The project's tools, kept outside the library and its wheel: the side-by-side
benchmark (``bench``) and the Ray Train demo (``demo``), run as ``python -m benchmarks``.
They use air-transfer's public API and its documented hooks only."""
