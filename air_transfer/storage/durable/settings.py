"""How the durable tier is fed: a frozen, validated part of ``StorageConfig`` that
travels with the storage to the agent that drains it."""

from __future__ import annotations

import fnmatch
import posixpath
from dataclasses import dataclass

from air_transfer.config import DURABLE_LAST as LAST_FILES

MiB = 1024 * 1024

#: Largest such file read whole into memory at the start of a pass (they are small;
#: a larger one is uploaded as any other file, in the pass's first part).
LAST_FILE_MAX_BYTES = 64 * MiB


@dataclass(frozen=True)
class DrainSettings:
    """``concurrency`` files uploaded at once; ``bytes_per_s``: a cap on the upload
    rate (None: none); ``chunk_bytes``: the checksum granularity of the records (a
    reader verifies whole chunks of this size); ``last``: name patterns of the files
    uploaded last (``LAST_FILES``); ``rescan_s``: the longest a change waits for a
    pass when nothing announced it (a write made outside the library);
    ``max_lag_bytes``: past this many bytes not yet in the durable tier, a report
    into node storage waits (None: never)."""

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

    def __post_init__(self) -> None:
        _positive_int("durable_concurrency", self.concurrency, 256)
        if self.bytes_per_s is not None:
            _positive_int("durable_bytes_per_s", self.bytes_per_s, 1 << 62)
        _positive_int("durable chunk_bytes", self.chunk_bytes, 2048 * MiB)
        if self.max_lag_bytes is not None:
            _positive_int("max_lag_bytes", self.max_lag_bytes, 1 << 62)
        if not isinstance(self.rescan_s, (int, float)) or not 0 < self.rescan_s <= 3600:
            raise ValueError(f"durable rescan_s must be in (0, 3600] s, got {self.rescan_s!r}")
        low, high = self.backoff_s
        if not 0 < low <= high <= 3600:
            raise ValueError(
                f"durable backoff_s must be 0 < first <= last <= 3600, got {self.backoff_s!r}"
            )
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
