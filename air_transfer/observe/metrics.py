"""Transfer metrics for the Ray dashboard and Prometheus, through ``ray.util.metrics``.

Each process records what it did itself (the node agent what it packed, a reader
what it fetched and wrote) and Ray's metrics agent of its node exports it; Prometheus
adds ``ray_`` in front of every name, and ``_total`` behind a counter's. Every series
is tagged ``strategy`` (``inline``, ``chunked``, ``streamed``, a custom strategy's
name, or what node storage passes) and ``node_id`` (the Ray node id of the process
that recorded it); Ray adds its own ``NodeAddress``, ``WorkerId`` and ``SessionName``.

- ``ray_air_transfer_packed_bytes_total`` (counter): source bytes read and checksummed
  into chunks (and stored, except by ``streamed``), recorded where packing ran.
- ``ray_air_transfer_fetched_bytes_total`` (counter): chunk bytes delivered to a reader
  from the object store (``to_directory``, ``open``, node-storage reads).
- ``ray_air_transfer_written_bytes_total`` (counter): file bytes a reader wrote and
  verified (``to_directory``; node-storage uploads).
- ``ray_air_transfer_chunks_verified_total`` (counter): chunks whose checksum a reader
  checked and found right.
- ``ray_air_transfer_checksum_failures_total`` (counter): ChecksumError raised by a
  reader (the target is then not published).
- ``ray_air_transfer_lost_transfers_total`` (counter): CheckpointLostError raised (the
  owner of the chunks is gone).
- ``ray_air_transfer_failed_transfers_total`` (counter): transfers that raised, with
  tags ``phase`` and ``error`` (the exception's class).
- ``ray_air_transfer_duration_seconds`` (histogram, tag ``phase``): how long a transfer
  that finished took: ``pack``, from the ``to_object_ref[_async]`` call to every chunk
  packed; ``read``, from the ``to_directory`` call to the directory published;
  ``upload`` and ``download`` for node storage's files (``telemetry.Transfer``).
- ``ray_air_transfer_transfers_in_flight`` (gauge, tag ``phase``): transfers running in
  the recording process now (sum over ``WorkerId`` for a node or the cluster).

Every metric of the package, here and in ``durable_metrics`` and ``replica_metrics``,
is one ``Metric``, declared at import and made on first use in each process, never at
import (Ray registers a metric with the process's core worker, which must exist). Recording is
one call per chunk (tens of MiB), never per byte; a process without a Ray session
records nothing (it would start one). ``AIR_TRANSFER_METRICS=0`` turns
recording off in a process (nothing is created); any failure to make or record a
metric is logged at debug level and ignored: a transfer never fails because of its
metrics.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import ClassVar, Literal

import ray

from air_transfer.core import environ

logger = logging.getLogger(__name__)

#: ``0`` (or ``false``, ``no``, ``off``) turns metric recording off in a process.
ENV_VAR = environ.METRICS
PREFIX = "air_transfer_"
#: Seconds: from a small checkpoint's tens of milliseconds to a large one's minutes.
DURATION_BOUNDARIES = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000]

Phase = Literal["pack", "read", "upload", "download"]
ByteCounter = Literal["packed", "fetched", "written"]
Kind = Literal["counter", "gauge", "histogram"]

_RECORD = {"counter": "inc", "gauge": "set", "histogram": "observe"}
_lock = threading.Lock()  # the in-flight counts, and their values' order
_making = threading.Lock()
_in_flight: dict[tuple[str, str], int] = {}


def enabled() -> bool:
    """Whether this process records metrics (``AIR_TRANSFER_METRICS``, default on)."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


class Metric:
    """One metric (``air_transfer_`` + ``name``), tagged ``tags`` and ``node_id``: a
    ``ray.util.metrics`` object made on first ``record`` in a process that records
    (``enabled``) and has a Ray session: making or recording a metric would start
    one, and a Ray-free caller of a transfer (``copy.copy_tree``) must never start
    Ray. One that cannot be made is off in this process; a record that fails is
    skipped; both logged at debug level. A counter records only what is above 0."""

    declared: ClassVar[list[Metric]] = []  # every metric of the package, for its docs

    def __init__(
        self,
        kind: Kind,
        name: str,
        description: str,
        tags: tuple[str, ...] = (),
        boundaries: list[float] | None = None,
    ) -> None:
        self.kind, self.name, self.description = kind, name, description
        self.tags, self.boundaries = (*tags, "node_id"), boundaries
        self._made: object | None = None
        self._broken = False
        Metric.declared.append(self)

    def record(self, value: float, **tags: str) -> None:
        if self.kind == "counter" and value <= 0:  # Counter.inc refuses 0
            return
        made = self._get()
        if made is not None:
            self._apply(made, value, {**tags, "node_id": node_id()})

    def _apply(self, made: object, value: float, tags: dict[str, str]) -> None:
        try:
            getattr(made, _RECORD[self.kind])(value, tags=tags)
        except Exception as e:
            logger.debug("air-transfer: could not record metric %s: %r", self.name, e)

    def _get(self) -> object | None:
        if not ray.is_initialized() or not enabled() or self._broken:
            return None
        if self._made is None:
            with _making:
                if self._made is None and not self._broken:
                    try:
                        self._made = self._make()
                    except Exception as e:
                        self._broken = True
                        logger.debug("air-transfer: metric %s is off: %r", self.name, e)
        return self._made

    def _make(self) -> object:
        from ray.util import metrics as ray_metrics

        name, tags = PREFIX + self.name, self.tags
        if self.kind == "histogram":
            return ray_metrics.Histogram(
                name, self.description, boundaries=self.boundaries or [], tag_keys=tags
            )
        cls = ray_metrics.Counter if self.kind == "counter" else ray_metrics.Gauge
        return cls(name, self.description, tag_keys=tags)


def node_id() -> str:
    """The Ray node id of this process (``unknown`` outside Ray). Asked each time
    (~2 us), not cached: after ``ray.shutdown()`` and ``ray.init()`` a process is on
    another node."""
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:
        return "unknown"


_BYTES = {
    "packed": Metric(
        "counter", "packed_bytes", "Source bytes read and checksummed into chunks.", ("strategy",)
    ),
    "fetched": Metric(
        "counter",
        "fetched_bytes",
        "Chunk bytes delivered to a reader from the object store.",
        ("strategy",),
    ),
    "written": Metric(
        "counter", "written_bytes", "File bytes a reader wrote, verified.", ("strategy",)
    ),
}
_VERIFIED = Metric(
    "counter", "chunks_verified", "Chunks whose checksum a reader checked.", ("strategy",)
)
_CHECKSUM_FAILURES = Metric(
    "counter", "checksum_failures", "ChecksumError raised by a reader.", ("strategy",)
)
_LOST = Metric(
    "counter",
    "lost_transfers",
    "CheckpointLostError raised: the owner of the chunks is gone.",
    ("strategy",),
)
_FAILED = Metric(
    "counter",
    "failed_transfers",
    "Transfers that raised, by phase and error.",
    ("error", "phase", "strategy"),
)
_DURATION = Metric(
    "histogram",
    "duration_seconds",
    "Seconds a finished transfer took, by phase.",
    ("phase", "strategy"),
    DURATION_BOUNDARIES,
)
_IN_FLIGHT = Metric(
    "gauge",
    "transfers_in_flight",
    "Transfers running in this process, by phase.",
    ("phase", "strategy"),
)


def add_bytes(counter: ByteCounter, nbytes: int, strategy: str) -> None:
    """``nbytes`` more bytes packed, fetched or written by a transfer of ``strategy``."""
    _BYTES[counter].record(nbytes, strategy=strategy)


def chunks_verified(count: int, strategy: str) -> None:
    """``count`` chunks passed their checksum on the reader's side."""
    _VERIFIED.record(count, strategy=strategy)


def checksum_failure(strategy: str) -> None:
    """A reader raised ChecksumError."""
    _CHECKSUM_FAILURES.record(1, strategy=strategy)


def lost(strategy: str) -> None:
    """CheckpointLostError is being raised."""
    _LOST.record(1, strategy=strategy)


def failed(phase: Phase, strategy: str, error: str) -> None:
    """A transfer of ``phase`` raised ``error`` (an exception class name)."""
    _FAILED.record(1, phase=phase, strategy=strategy, error=error)


def duration(phase: Phase, strategy: str, seconds: float) -> None:
    """A transfer of ``phase`` finished after ``seconds``."""
    _DURATION.record(max(seconds, 0.0), phase=phase, strategy=strategy)


def in_flight(phase: Phase, strategy: str, delta: int) -> None:
    """One transfer of ``phase`` started (``delta`` 1) or ended (-1) in this process."""
    with _lock:  # held while recording: two threads' values must land in order
        key = (phase, strategy)
        count = _in_flight[key] = max(_in_flight.get(key, 0) + delta, 0)
        _IN_FLIGHT.record(count, phase=phase, strategy=strategy)
