"""Node storage with ``placement="writer"``, the reads: a placed file's bytes from
its holders (this node's first, from its disk; the others through their agents, in
an order drawn from the reader's node id), every chunk checked against the
checksums the writer recorded (``placed_sums``); a holder lost, missing the blob or
holding bytes that do not match hands over to the next at the chunk not yet read.
"""

from __future__ import annotations

import errno
import logging
import zlib
from collections.abc import Iterator

import ray

from air_transfer.cluster.nodes import live_node_ids, this_node_id
from air_transfer.core.checksum import chunk_checksum
from air_transfer.errors import ChecksumError
from air_transfer.storage.client.placed_sums import (
    HolderLinks,
    fetch_sums,
    local_chunks,
    not_matching,
)
from air_transfer.storage.client.replica_set import is_lost
from air_transfer.storage.client.streams import _chunks
from air_transfer.storage.placed_record import Holder, PlacedRecord, PlacedSums

logger = logging.getLogger(__name__)


def read_order(record: PlacedRecord) -> list[Holder]:
    """The holders a read of ``record`` tries: this node's first, then the others
    in an order drawn from this node's id (readers spread over them)."""
    here = this_node_id() if ray.is_initialized() else ""
    others = sorted(h for h in record.holders if h[0] != here)
    turn = zlib.crc32(f"{here}:{record.blob}".encode()) % max(1, len(others))
    return [h for h in record.holders if h[0] == here] + others[turn:] + others[:turn]


def sums_of(links: HolderLinks, path: str, record: PlacedRecord, order: list[Holder]) -> PlacedSums:
    """The checksums of placed file ``path`` from the first holder in ``order``
    whose copy of them matches ``record``."""
    live, tried, damaged = live_node_ids(), [], False
    for holder in order:
        if holder[0] not in live:
            tried.append(f"{holder[0][:12]}: gone")
            continue
        try:
            return fetch_sums(links, path, record, holder)
        except (OSError, ValueError) as e:
            tried.append(f"{holder[0][:12]}: {type(e).__name__}")
            damaged = _skipped(path, holder, e) or damaged
    raise _none_left(path, record, tried, damaged)


def placed_chunks(
    links: HolderLinks,
    path: str,
    record: PlacedRecord,
    sums: PlacedSums,
    order: list[Holder],
    first: int,
    last: int,
) -> Iterator[tuple[int, memoryview]]:
    """The chunks of placed file ``path`` from ``first``, each checked against
    ``sums``, from one holder (in ``order``: this node's from its disk, the others
    through their agents); when one is lost, lacks them or holds bytes that do not
    match, from the next, resuming at the chunk not yet handed out."""
    here = this_node_id() if ray.is_initialized() else ""
    live, tried, damaged = live_node_ids(), [], False
    for holder in order:
        if holder[0] not in live:
            tried.append(f"{holder[0][:12]}: gone")
            continue
        where, cb = record.where(holder), sums.chunk_bytes
        try:
            if holder[0] == here:
                got = local_chunks(holder[1], where, record.size, cb, first)
            else:
                link = links.placed_link(*holder)
                got = _chunks(link, where, record.size, first, last, cb)
            for index, view in got:
                if chunk_checksum(view) != sums.sums[index]:
                    raise ChecksumError(
                        errno.EIO, f"chunk {index} does not match its record", where
                    )
                yield index, view
                first = index + 1
            return
        except Exception as e:
            if not (is_lost(e) or isinstance(e, OSError)):
                raise
            tried.append(f"{holder[0][:12]}: {type(e).__name__}")
            damaged = _skipped(path, holder, e) or damaged
    raise _none_left(path, record, tried, damaged)


def _skipped(path: str, holder: Holder, error: Exception) -> bool:
    """Log that holder ``holder`` of ``path`` failed a read (lost, or bytes that do
    not match the record) and the read goes on from another; whether it was the
    bytes."""
    lost = is_lost(error) or isinstance(error, FileNotFoundError)
    logger.warning(
        "air-transfer: the holder of %s on node %s %s (%s: %s); reading on from another holder",
        path,
        holder[0][:12],
        "failed mid-read" if lost else "holds bytes that do not match its record",
        type(error).__name__,
        error,
    )
    return not lost


def _none_left(path: str, record: PlacedRecord, tried: list[str], damaged: bool) -> OSError:
    """The error of a read of ``path`` that no holder could serve: ChecksumError if
    one held bytes that do not match its record, else ConnectionError (all lost)."""
    if damaged:
        return not_matching(path, record, tried)
    return ConnectionError(
        f"no live holder of {path!r} is left to read from (placement='writer'; "
        f"tried {', '.join(tried)})"
    )
