"""What a transfer shows while it runs: Ray metrics, progress bars, and
``telemetry``, which ties both to one transfer. Never changes what is moved. May
import ``cluster``, ``core``, ``config`` and ``errors``.
"""
