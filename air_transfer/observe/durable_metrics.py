"""Metrics of node storage's durable tier: the bytes not yet there
(``air_transfer_durable_lag_bytes``, a gauge per storage), the bytes uploaded
(``air_transfer_durable_uploaded_bytes``, a counter), how fast the last pass sent
them (``air_transfer_durable_upload_bytes_per_second``, a gauge) and the passes that
failed (``air_transfer_durable_upload_errors``, a counter by error class).

Beside ``metrics`` (same switch, ``AIR_TRANSFER_METRICS``, same prefix), made on
first use in the process that drains (the storage node's agent); a process without
a Ray session records nothing, and a metric that cannot be made is logged at debug
level and skipped: a drain never fails because of its metrics.
"""

from __future__ import annotations

import logging
import threading

import ray

from air_transfer.observe.metrics import PREFIX, enabled, node_id

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_made: dict[str, object] = {}
_DESCRIPTIONS = {
    "durable_lag_bytes": "Bytes of node storage not yet in its durable tier.",
    "durable_uploaded_bytes": "Bytes node storage's drain uploaded to the durable tier.",
    "durable_upload_errors": "Drain passes of node storage that failed (retried).",
    "durable_upload_bytes_per_second": "Bytes per second the last drain pass that sent "
    "any uploaded to the durable tier.",
}
_GAUGES = ("durable_lag_bytes", "durable_upload_bytes_per_second")


def _metric(name: str) -> object | None:
    if not ray.is_initialized() or not enabled():
        return None
    with _lock:
        if name not in _made:
            from ray.util.metrics import Counter, Gauge

            kind = Gauge if name in _GAUGES else Counter
            tags = ("node_id", "error") if name == "durable_upload_errors" else ("node_id",)
            try:
                _made[name] = kind(PREFIX + name, _DESCRIPTIONS[name], tag_keys=tags)
            except Exception as e:
                logger.debug("air-transfer: metric %s is off: %r", name, e)
                return None
        return _made[name]


def _record(name: str, how: str, value: float, **tags: str) -> None:
    metric = _metric(name)
    if metric is None:
        return
    try:
        getattr(metric, how)(value, tags={"node_id": node_id(), **tags})
    except Exception as e:
        logger.debug("air-transfer: could not record %s: %r", name, e)


def lag(nbytes: int) -> None:
    """The bytes of this node's storage not yet in the durable tier."""
    _record("durable_lag_bytes", "set", nbytes)


def uploaded(nbytes: int) -> None:
    if nbytes:
        _record("durable_uploaded_bytes", "inc", nbytes)


def upload_rate(bytes_per_s: float) -> None:
    """How fast the last drain pass that sent anything sent it."""
    _record("durable_upload_bytes_per_second", "set", bytes_per_s)


def upload_error(error: str) -> None:
    _record("durable_upload_errors", "inc", 1, error=error)
