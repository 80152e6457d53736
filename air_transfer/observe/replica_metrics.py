"""Metrics of node storage replicas: writes that completed on fewer copies than
asked (degraded), repairs that failed, and the bytes short of K copies while repair
has not caught up.

Each a ``metrics.Metric`` (same switch, ``AIR_TRANSFER_METRICS``, same prefix), made
on first use in the process that records it: the writer, and the replica registry.
"""

from __future__ import annotations

from air_transfer.observe.metrics import Metric

_DEGRADED = Metric(
    "counter",
    "degraded_writes",
    "Node storage writes that completed on fewer copies than asked.",
)
_REPAIR_FAILED = Metric(
    "counter",
    "replica_repair_failures",
    "Repairs of a node storage copy that failed (the copy stays stale).",
)
_UNDER = Metric(
    "gauge",
    "under_replicated_bytes",
    "Bytes of replicated node storage short of its K complete copies.",
)


def degraded_write() -> None:
    """One write completed on fewer copies than the storage keeps."""
    _DEGRADED.record(1)


def repair_failed() -> None:
    """One repair of a copy failed (``replica_status`` says which and why)."""
    _REPAIR_FAILED.record(1)


def under_replicated(nbytes: int) -> None:
    """Set the bytes short of K copies, over every replicated storage."""
    _UNDER.record(nbytes)
