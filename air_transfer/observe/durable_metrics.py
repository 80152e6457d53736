"""Metrics of node storage's durable tier: the bytes not yet there
(``air_transfer_durable_lag_bytes``, a gauge per storage), the bytes uploaded
(``air_transfer_durable_uploaded_bytes``, a counter), how fast the last pass sent
them (``air_transfer_durable_upload_bytes_per_second``, a gauge) and the passes that
failed (``air_transfer_durable_upload_errors``, a counter by error class).

Each a ``metrics.Metric`` (same switch, ``AIR_TRANSFER_METRICS``, same prefix), made
on first use in the process that drains (the storage node's agent): a drain never
fails because of its metrics.
"""

from __future__ import annotations

from air_transfer.observe.metrics import Metric

_LAG = Metric("gauge", "durable_lag_bytes", "Bytes of node storage not yet in its durable tier.")
_UPLOADED = Metric(
    "counter",
    "durable_uploaded_bytes",
    "Bytes node storage's drain uploaded to the durable tier.",
)
_ERRORS = Metric(
    "counter",
    "durable_upload_errors",
    "Drain passes of node storage that failed (retried).",
    ("error",),
)
_RATE = Metric(
    "gauge",
    "durable_upload_bytes_per_second",
    "Bytes per second the last drain pass that sent any uploaded to the durable tier.",
)


def lag(nbytes: int) -> None:
    """The bytes of this node's storage not yet in the durable tier."""
    _LAG.record(nbytes)


def uploaded(nbytes: int) -> None:
    _UPLOADED.record(nbytes)


def upload_rate(bytes_per_s: float) -> None:
    """How fast the last drain pass that sent anything sent it."""
    _RATE.record(bytes_per_s)


def upload_error(error: str) -> None:
    _ERRORS.record(1, error=error)
