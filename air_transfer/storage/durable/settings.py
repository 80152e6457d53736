"""How the durable tier is fed: a frozen, validated part of ``StorageConfig`` that
travels with the storage to the agent that drains it."""

from __future__ import annotations

import fnmatch
import math
import posixpath
from dataclasses import dataclass

from air_transfer.config import DURABLE_LAST as LAST_FILES
from air_transfer.storage.durable import codecs
from air_transfer.storage.durable.records import IDENTITY
from air_transfer.storage.durable.s3 import MAX_PARTS, MIN_PART_BYTES

MiB = 1024 * 1024

#: Largest such file read whole into memory at the start of a pass (they are small;
#: a larger one is uploaded as any other file, in the pass's first part).
LAST_FILE_MAX_BYTES = 64 * MiB


@dataclass(frozen=True)
class DrainSettings:
    """``concurrency`` files uploaded at once; ``bytes_per_s``: a cap on the upload
    rate (None: none; a writer-placed storage's: on each node's); ``chunk_bytes``:
    the checksum granularity of the records (a reader verifies whole chunks of this
    size); ``last``: name patterns of the files
    uploaded last (``LAST_FILES``); ``rescan_s``: the longest a change waits for a
    pass when nothing announced it (a write made outside the library);
    ``max_lag_bytes``: past this many bytes not yet in the durable tier, a report
    into node storage waits (None: never); ``scrub_s``: how often everything the
    drain counts durable is confirmed in the tier again, its size and version (one
    HEAD a file; None: only when asked); ``scrub_bytes_per_s``: besides, the rate at
    which stored bytes are read back and checked against their checksums (None:
    never); ``read_wait_s``: how long a read the tier alone can answer waits for an
    endpoint that does not answer; ``part_bytes``, ``max_parts``,
    ``part_bytes_in_flight``: S3 multipart uploads (parts of at least ``part_bytes``,
    larger where a file needs more than ``max_parts``, at most
    ``part_bytes_in_flight`` bytes of parts sent at once); ``codec``: how the
    tier stores files (``codecs``); ``placed_root``: a writer-placed storage's
    ``replica_root``, under which (formatted per node) the nodes that hold its
    placed files' bytes keep them, and send them to the tier from there (None: a
    storage with no placed files, whose drain refuses one)."""

    concurrency: int = 4
    bytes_per_s: int | None = None
    chunk_bytes: int = 32 * MiB
    last: tuple[str, ...] = LAST_FILES
    rescan_s: float = 30.0
    max_lag_bytes: int | None = None
    #: Seconds between failed passes: the first, doubling up to the second.
    backoff_s: tuple[float, float] = (1.0, 30.0)
    #: How often a copy that does not lead a replicated storage's drain asks again
    #: whether it does (the takeover's delay once the leading copy's node is gone).
    lead_poll_s: float = 1.0
    scrub_s: float | None = 3600.0
    scrub_bytes_per_s: int | None = None
    read_wait_s: float = 30.0
    part_bytes: int = 32 * MiB
    max_parts: int = MAX_PARTS
    part_bytes_in_flight: int = 256 * MiB
    codec: str = IDENTITY
    placed_root: str | None = None

    def __post_init__(self) -> None:
        _positive_int("durable_concurrency", self.concurrency, 256)
        if self.bytes_per_s is not None:
            _positive_int("durable_bytes_per_s", self.bytes_per_s, 1 << 62)
        _positive_int("durable chunk_bytes", self.chunk_bytes, 2048 * MiB)
        if self.max_lag_bytes is not None:
            _positive_int("max_lag_bytes", self.max_lag_bytes, 1 << 62)
        _seconds("durable rescan_s", self.rescan_s, 3600)
        low, high = self.backoff_s
        if not 0 < low <= high <= 3600:
            raise ValueError(
                f"durable backoff_s must be 0 < first <= last <= 3600, got {self.backoff_s!r}"
            )
        _seconds("durable lead_poll_s", self.lead_poll_s, 3600)
        if self.scrub_s is not None:
            _seconds("durable_scrub_s", self.scrub_s, 30 * 86400)
        if self.scrub_bytes_per_s is not None:
            _positive_int("durable_scrub_bytes_per_s", self.scrub_bytes_per_s, 1 << 62)
        _seconds("durable_read_wait_s", self.read_wait_s, 3600)
        _positive_int("durable_part_bytes", self.part_bytes, 5 * 1024 * MiB)
        if self.part_bytes < MIN_PART_BYTES:
            raise ValueError(
                f"StorageConfig.durable_part_bytes = {self.part_bytes} is below S3's "
                f"smallest part, {MIN_PART_BYTES} bytes"
            )
        _positive_int("durable max_parts", self.max_parts, MAX_PARTS)
        _positive_int("durable_part_bytes_in_flight", self.part_bytes_in_flight, 1 << 62)
        codecs.check(self.codec)
        if not all(isinstance(p, str) and p for p in self.last):
            raise ValueError(f"durable_last must be file name patterns, got {self.last!r}")

    def is_last(self, rel: str) -> bool:
        """Whether ``rel`` is uploaded after the rest of its pass."""
        name = posixpath.basename(rel)
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.last)


def _positive_int(name: str, value: object, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"StorageConfig.{name} must be an int, got {value!r}")
    if not 1 <= value <= high:
        raise ValueError(f"StorageConfig.{name} = {value} is outside [1, {high}]")


def _seconds(name: str, value: object, high: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= high
    ):
        raise ValueError(f"StorageConfig.{name} must be seconds in (0, {high:g}], got {value!r}")
