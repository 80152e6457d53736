"""One file of node storage put into the durable tier, verified, whole or not at all.

The file is read twice: once to take its chunk checksums (``measure``: a read error or
a change then fails before anything is written there), once to send the bytes
(``send``), whose checksums must come out the same, each chunk stored by the tier's
codec. A file whose bytes the tier holds under another name is copied there
(``copy``: server-side, no byte leaves the cluster) only from a source the tier
confirms unchanged since the drain confirmed it (its size, version and digest);
otherwise it is sent. ``confirm`` asks the tier what it holds at a path now: nothing
is counted durable before that answer matches.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.confine import open_regular, storage_path
from air_transfer.errors import SourceChangedError
from air_transfer.storage.durable import codecs
from air_transfer.storage.durable.objects import Head, TierObjects
from air_transfer.storage.durable.records import IDENTITY, FileRecord
from air_transfer.storage.server.drain.scan import Seen

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


class RateLimit:
    """At most ``bytes_per_s`` through ``take`` over all threads (None: no cap): a
    token bucket holding one second's worth."""

    def __init__(self, bytes_per_s: int | None) -> None:
        self.rate = bytes_per_s
        self._lock = threading.Lock()
        self._tokens = float(bytes_per_s or 0)
        self._at = time.monotonic()

    def take(self, nbytes: int) -> None:
        if self.rate is None:
            return
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.rate, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= nbytes
            short = -self._tokens
        if short > 0:
            time.sleep(short / self.rate)


def measure(root: str, seen: Seen, chunk_bytes: int) -> FileRecord | None:
    """The record of node storage's file ``seen`` (its chunk checksums, read now);
    None if it was replaced since the scan (the next pass takes the new one)."""
    fd, st = open_regular(root, storage_path(root, seen.rel))
    try:
        if Seen.of(seen.rel, st).version != seen.version:
            return None
        sums = []
        for offset in range(0, st.st_size, chunk_bytes):
            n = min(chunk_bytes, st.st_size - offset)
            data = os.pread(fd, n, offset)
            if len(data) != n:
                raise OSError(f"read {len(data)} of {n} bytes at offset {offset}: the file shrank")
            sums.append(chunk_checksum(data))
        _unchanged(fd, seen)
        return FileRecord(st.st_size, st.st_mtime_ns, seen.mode, chunk_bytes, tuple(sums))
    finally:
        os.close(fd)


def send(
    root: str, objects: TierObjects, seen: Seen, record: FileRecord, codec: str, limit: RateLimit
) -> FileRecord | None:
    """Upload node storage's file ``seen`` (measured as ``record``) to its path in the
    tier, each chunk checked against ``record`` and stored by ``codec``; the record
    of what was stored (tag and all, confirmed), or None if the file was replaced."""
    fd, st = open_regular(root, storage_path(root, seen.rel))
    try:
        if Seen.of(seen.rel, st).version != seen.version:
            return None
        made = upload(objects, seen.rel, record, codec, limit, _read_again(fd, seen, record))
    finally:
        os.close(fd)
    return confirm(objects, seen.rel, made, check_tag=True)


def upload(
    objects: TierObjects,
    rel: str,
    record: FileRecord,
    codec: str,
    limit: RateLimit,
    chunks: Iterator[bytes],
) -> FileRecord:
    """Upload the file ``record`` describes to ``rel`` in the tier, whole or not at
    all, from ``chunks`` (its chunks in order, each checked against ``record`` by
    whoever yields it, which raises where one does not match), each stored by
    ``codec``; the record of what was stored, with the tier's tag (not yet
    confirmed: ``confirm``)."""
    writer = objects.writer(objects.target.path(rel), record.size, record.digest)
    stored: list[int] = []
    try:
        for index, data in enumerate(chunks):
            out = _stored(codec, index, data)
            if out is None:  # the first chunk does not shrink: the file goes as it is
                codec, out = IDENTITY, data
            stored.append(len(memoryview(out)))
            limit.take(stored[-1])
            writer.write(out)
        if len(stored) != len(record.sums):
            raise OSError(f"{len(stored)} of the {len(record.sums)} chunks of {rel} were read")
    except BaseException:
        writer.abort()
        raise
    tag = writer.commit()
    made = record if codec == IDENTITY else replace(record, codec=codec, stored=tuple(stored))
    return made.confirmed(tag)


def _read_again(fd: int, seen: Seen, record: FileRecord) -> Iterator[bytes]:
    """The chunks of node storage's open file ``fd``, read a second time, each as
    ``record`` measured it; SourceChangedError for one that is not, or a file
    changed by the end."""
    for index in range(len(record.sums)):
        data = os.pread(fd, record.chunk_length(index), index * record.chunk_bytes)
        if chunk_checksum(data) != record.sums[index]:
            raise SourceChangedError(
                errno.EAGAIN,
                f"chunk {index} changed between two reads of the file; the next "
                "drain pass takes it as it is then",
                seen.rel,
            )
        yield data
    _unchanged(fd, seen)


def _stored(codec: str, index: int, data: bytes) -> Buffer | None:
    """Chunk ``index`` as ``codec`` stores it (``codecs``: encoded where that makes it
    shorter, else as it is); None if it is the first and does not shrink (the file
    is then stored as it is, decided once per file)."""
    if codec == IDENTITY:
        return data
    encoded = codecs.encode(codec, data)
    if encoded is None:
        return None if index == 0 else data
    return encoded


def send_bytes(objects: TierObjects, rel: str, record: FileRecord, data: bytes) -> FileRecord:
    """Upload ``data`` (a file read whole at the start of the pass, as ``record``
    describes it) to ``rel``; its confirmed record."""
    tag = objects.put(objects.target.path(rel), data, record.digest)
    confirmed = confirm(objects, rel, record.confirmed(tag), check_tag=True)
    assert confirmed is not None
    return confirmed


def copy(
    objects: TierObjects, source: str, held: FileRecord, rel: str, record: FileRecord
) -> FileRecord | None:
    """Copy the tier's ``source`` (recorded as ``held``, the same content as
    ``record``) to ``rel`` inside the tier, if the tier confirms ``source`` is what
    the drain stored there; the confirmed record of the copy, or None where the
    source is not (lost, replaced: send instead)."""
    if not objects.server_side_copies:
        return None
    src = objects.target.path(source)
    if not _matches(objects.head(src), held):
        return None
    tag = objects.copy(src, objects.target.path(rel), held.stored_size)
    made = replace(record, codec=held.codec, stored=held.stored)
    return confirm(objects, rel, made.confirmed(tag), check_tag=True)


def confirm(
    objects: TierObjects, rel: str, record: FileRecord, check_tag: bool = True
) -> FileRecord | None:
    """``record`` if the tier holds it at ``rel`` now (its size, the digest it was
    uploaded with where the tier keeps one, its version where ``check_tag``); the
    tier's version is taken where the record has none. None otherwise."""
    found = objects.head(objects.target.path(rel))
    if not _matches(found, record if check_tag else record.confirmed("")):
        return None
    assert found is not None
    return record if record.tag else record.confirmed(found.tag)


def _matches(found: Head | None, record: FileRecord) -> bool:
    if found is None or found.size != record.stored_size:
        return False
    if found.digest is not None and found.digest != record.digest:
        return False
    return not record.tag or found.tag == record.tag


def _unchanged(fd: int, seen: Seen) -> None:
    if Seen.of(seen.rel, os.fstat(fd)).version != seen.version:
        raise SourceChangedError(
            errno.EAGAIN, "changed while it was uploaded; the next drain pass takes it", seen.rel
        )
