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

The metric objects are made on first use in each process, never at import (Ray
registers a metric with the process's core worker, which must exist). Recording is
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
from dataclasses import dataclass
from typing import Literal

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

_TAGS = ("strategy", "node_id")
_PHASE_TAGS = ("phase", *_TAGS)


@dataclass(frozen=True)
class _Registry:
    """This process's metric objects (``ray.util.metrics`` classes)."""

    bytes: dict[str, object]
    chunks_verified: object
    checksum_failures: object
    lost: object
    failed: object
    duration: object
    in_flight: object


_registry: _Registry | None = None
_broken = False
_lock = threading.Lock()
_in_flight: dict[tuple[str, str], int] = {}


def enabled() -> bool:
    """Whether this process records metrics (``AIR_TRANSFER_METRICS``, default on)."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def _make_registry() -> _Registry:
    from ray.util.metrics import Counter, Gauge, Histogram

    def counter(name: str, description: str, tags: tuple[str, ...] = _TAGS) -> object:
        return Counter(PREFIX + name, description, tag_keys=tags)

    return _Registry(
        bytes={
            "packed": counter("packed_bytes", "Source bytes read and checksummed into chunks."),
            "fetched": counter(
                "fetched_bytes", "Chunk bytes delivered to a reader from the object store."
            ),
            "written": counter("written_bytes", "File bytes a reader wrote, verified."),
        },
        chunks_verified=counter("chunks_verified", "Chunks whose checksum a reader checked."),
        checksum_failures=counter("checksum_failures", "ChecksumError raised by a reader."),
        lost=counter(
            "lost_transfers", "CheckpointLostError raised: the owner of the chunks is gone."
        ),
        failed=counter(
            "failed_transfers",
            "Transfers that raised, by phase and error.",
            ("error", *_PHASE_TAGS),
        ),
        duration=Histogram(
            PREFIX + "duration_seconds",
            "Seconds a finished transfer took, by phase.",
            boundaries=DURATION_BOUNDARIES,
            tag_keys=_PHASE_TAGS,
        ),
        in_flight=Gauge(
            PREFIX + "transfers_in_flight",
            "Transfers running in this process, by phase.",
            _PHASE_TAGS,
        ),
    )


def _get() -> _Registry | None:
    """The registry, made on first use; None when off, when it cannot be made, or
    outside a Ray session: making or recording a metric would start one (a Ray-free
    caller of a transfer, e.g. ``copy.copy_tree``, must never start Ray)."""
    global _registry, _broken
    if not ray.is_initialized():
        return None
    if _registry is not None:
        return _registry if enabled() else None
    if _broken or not enabled():
        return None
    with _lock:
        if _registry is None and not _broken:
            try:
                _registry = _make_registry()
            except Exception as e:
                _broken = True
                logger.debug("air-transfer: metrics are off in this process: %r", e)
    return _registry


def node_id() -> str:
    """The Ray node id of this process (``unknown`` outside Ray). Asked each time
    (~2 us), not cached: after ``ray.shutdown()`` and ``ray.init()`` a process is on
    another node."""
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:
        return "unknown"


def _record(what: str, metric: object, value: float, tags: dict[str, str], how: str) -> None:
    try:
        getattr(metric, how)(value, tags={**tags, "node_id": node_id()})
    except Exception as e:
        logger.debug("air-transfer: could not record metric %s: %r", what, e)


def add_bytes(counter: ByteCounter, nbytes: int, strategy: str) -> None:
    """``nbytes`` more bytes packed, fetched or written by a transfer of ``strategy``."""
    registry = _get()
    if registry is not None and nbytes > 0:  # Counter.inc refuses 0
        metric = registry.bytes[counter]
        _record(counter, metric, nbytes, {"strategy": strategy}, "inc")


def chunks_verified(count: int, strategy: str) -> None:
    """``count`` chunks passed their checksum on the reader's side."""
    registry = _get()
    if registry is not None and count > 0:
        _record("chunks_verified", registry.chunks_verified, count, {"strategy": strategy}, "inc")


def checksum_failure(strategy: str) -> None:
    """A reader raised ChecksumError."""
    registry = _get()
    if registry is not None:
        _record("checksum_failures", registry.checksum_failures, 1, {"strategy": strategy}, "inc")


def lost(strategy: str) -> None:
    """CheckpointLostError is being raised."""
    registry = _get()
    if registry is not None:
        _record("lost", registry.lost, 1, {"strategy": strategy}, "inc")


def failed(phase: Phase, strategy: str, error: str) -> None:
    """A transfer of ``phase`` raised ``error`` (an exception class name)."""
    registry = _get()
    if registry is not None:
        tags = {"phase": phase, "strategy": strategy, "error": error}
        _record("failed", registry.failed, 1, tags, "inc")


def duration(phase: Phase, strategy: str, seconds: float) -> None:
    """A transfer of ``phase`` finished after ``seconds``."""
    registry = _get()
    if registry is not None:
        tags = {"phase": phase, "strategy": strategy}
        _record("duration", registry.duration, max(seconds, 0.0), tags, "observe")


def in_flight(phase: Phase, strategy: str, delta: int) -> None:
    """One transfer of ``phase`` started (``delta`` 1) or ended (-1) in this process."""
    registry = _get()
    if registry is None:
        return
    tags = {"phase": phase, "strategy": strategy}
    with _lock:  # held while recording: two threads' values must land in order
        key = (phase, strategy)
        count = _in_flight[key] = max(_in_flight.get(key, 0) + delta, 0)
        _record("in_flight", registry.in_flight, count, tags, "set")
