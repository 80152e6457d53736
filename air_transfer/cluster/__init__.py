"""The cluster as this library sees it: nodes and their agents found by name,
chunks fetched in order a window ahead, and ``_ray``, the one module that touches
Ray's private API (pinned by a test). May import ``core``, ``config`` and ``errors``.
"""
