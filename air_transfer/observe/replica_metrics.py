"""Metrics of node storage replicas: writes that completed on fewer copies than
asked (degraded), repairs that failed, and the bytes short of K copies while repair
has not caught up.

Beside ``metrics`` (same switch, ``AIR_TRANSFER_METRICS``, same prefix), made on
first use in the process that records them: the writer, and the replica registry.
"""

from __future__ import annotations

import logging
import threading

import ray

from air_transfer.observe.metrics import PREFIX, enabled, node_id

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_made: dict[str, object] = {}


def _metric(name: str) -> object | None:
    if not ray.is_initialized() or not enabled():
        return None
    with _lock:
        if name not in _made:
            from ray.util.metrics import Counter, Gauge

            try:
                if name == "degraded":
                    _made[name] = Counter(
                        PREFIX + "degraded_writes",
                        "Node storage writes that completed on fewer copies than asked.",
                        tag_keys=("node_id",),
                    )
                elif name == "repair_failed":
                    _made[name] = Counter(
                        PREFIX + "replica_repair_failures",
                        "Repairs of a node storage copy that failed (the copy stays stale).",
                        tag_keys=("node_id",),
                    )
                else:
                    _made[name] = Gauge(
                        PREFIX + "under_replicated_bytes",
                        "Bytes of replicated node storage short of its K complete copies.",
                        tag_keys=("node_id",),
                    )
            except Exception as e:
                logger.debug("air-transfer: replica metric %s is off: %r", name, e)
                return None
        return _made[name]


def degraded_write() -> None:
    """One write completed on fewer copies than the storage keeps."""
    metric = _metric("degraded")
    if metric is not None:
        try:
            metric.inc(1, tags={"node_id": node_id()})  # type: ignore[attr-defined]
        except Exception as e:
            logger.debug("air-transfer: could not record degraded_writes: %r", e)


def repair_failed() -> None:
    """One repair of a copy failed (``replica_status`` says which and why)."""
    metric = _metric("repair_failed")
    if metric is not None:
        try:
            metric.inc(1, tags={"node_id": node_id()})  # type: ignore[attr-defined]
        except Exception as e:
            logger.debug("air-transfer: could not record replica_repair_failures: %r", e)


def under_replicated(nbytes: int) -> None:
    """Set the bytes short of K copies, over every replicated storage."""
    metric = _metric("under")
    if metric is not None:
        try:
            metric.set(nbytes, tags={"node_id": node_id()})  # type: ignore[attr-defined]
        except Exception as e:
            logger.debug("air-transfer: could not record under_replicated_bytes: %r", e)
