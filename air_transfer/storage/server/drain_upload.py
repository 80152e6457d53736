"""One file of node storage put into the durable tier, verified, whole or not at all.

The file is read twice: once to take its chunk checksums (``measure``: a read error
or a change then fails before anything is written there), once to send the bytes
(``upload``), whose checksums must come out the same. A file
whose bytes the durable tier already holds under another name (a checkpoint that
kept a frozen file) is copied there instead (``copy_file``: server-side on S3 and
GCS, no byte leaves the cluster). On an object store the upload appears only when
it completes (a drain killed mid-upload leaves nothing there); elsewhere it is
written under a temporary name and moved into place. Its record is written after
it, so a record never describes bytes that are not there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow.fs as pafs

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.confine import open_regular, storage_path
from air_transfer.errors import ChecksumError, SourceChangedError
from air_transfer.storage.durable.records import FileRecord, file_sums, write_record
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.server.drain_scan import Seen


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


@dataclass(frozen=True)
class Uploaded:
    """What putting one file cost: its record, and the bytes sent (0 when it was
    copied inside the durable tier or was there already)."""

    record: FileRecord
    sent: int


def measure(root: str, seen: Seen, chunk_bytes: int) -> FileRecord | None:
    """The record of node storage's file ``seen``: its chunk checksums, read now (a
    read error fails here, before anything is sent); None if it was replaced since
    the scan (the next pass takes the new one)."""
    fd, st = open_regular(root, storage_path(root, seen.rel))
    try:
        if Seen.of(seen.rel, st).version != seen.version:
            return None
        record = FileRecord(
            st.st_size, st.st_mtime_ns, seen.mode, chunk_bytes,
            tuple(file_sums(fd, st.st_size, chunk_bytes)),
        )  # fmt: skip
        _unchanged(fd, seen)
        return record
    finally:
        os.close(fd)


def upload(
    root: str,
    target: DurableTarget,
    seen: Seen,
    record: FileRecord,
    limit: RateLimit,
    holding: Callable[[FileRecord], str | None],
) -> Uploaded | None:
    """Put node storage's file ``seen``, whose checksums ``measure`` took, at the same
    path in the durable tier; None if it was replaced since. ``holding`` names a path
    of the durable tier that holds the same bytes, if any."""
    fd, st = open_regular(root, storage_path(root, seen.rel))
    try:
        if Seen.of(seen.rel, st).version != seen.version:
            return None
        same = holding(record)
        if same == seen.rel:
            sent = 0  # there already (a drain that took over, or a restarted agent)
        elif same is not None:
            _copy(target, same, seen.rel)
            sent = 0
        else:
            _send(target, fd, seen, record, limit)
            sent = record.size
        _check_size(target, seen.rel, record.size)
        write_record(target, seen.rel, record)
        return Uploaded(record, sent)
    finally:
        os.close(fd)


def upload_bytes(target: DurableTarget, seen: Seen, data: bytes, chunk_bytes: int) -> FileRecord:
    """Put ``data``, node storage's file ``seen`` as read at the start of the pass (a
    file uploaded last: small, read before the rest was scanned)."""
    sums = tuple(
        chunk_checksum(data[i : i + chunk_bytes]) for i in range(0, len(data), chunk_bytes)
    )
    record = FileRecord(len(data), seen.mtime_ns, seen.mode, chunk_bytes, sums)
    _write(target, seen.rel, lambda out: out.write(data))
    _check_size(target, seen.rel, record.size)
    write_record(target, seen.rel, record)
    return record


def _send(target: DurableTarget, fd: int, seen: Seen, record: FileRecord, limit: RateLimit) -> None:
    def stream(out: pafs.NativeFile) -> None:
        for index in range(len(record.sums)):
            offset = index * record.chunk_bytes
            data = os.pread(fd, record.chunk_length(index), offset)
            if chunk_checksum(data) != record.sums[index]:
                raise SourceChangedError(
                    errno.EAGAIN,
                    f"chunk {index} changed between two reads of the file; it is "
                    "uploaded again by the next drain pass",
                    seen.rel,
                )
            limit.take(len(data))
            out.write(data)
        _unchanged(fd, seen)

    _write(target, seen.rel, stream)


def _write(target: DurableTarget, rel: str, fill: Callable[[pafs.NativeFile], None]) -> None:
    """Write ``rel`` with ``fill``: in place on an object store (visible once
    complete), else under a temporary name moved into place once whole."""
    fs = target.filesystem
    final = target.path(rel)
    if target.atomic_writes:
        out = fs.open_output_stream(final)
        try:
            fill(out)
        except BaseException:
            _withdraw(fs, out, final)
            raise
        out.close()
        return
    fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
    staged = target.staged(rel)
    try:
        with fs.open_output_stream(staged) as out:
            fill(out)
        fs.move(staged, final)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.delete_file(staged)
        raise


def _withdraw(fs: pafs.FileSystem, out: pafs.NativeFile, final: str) -> None:
    """An object-store upload that failed mid-way on our side. pyarrow has no abort
    (closing, even from a destructor, completes the upload: apache/arrow's S3
    ``ObjectOutputStream``), so it is completed and deleted at once. Only a read
    error or a change made in place by something else than node storage (which
    replaces files, never changes them) gets here; a drain killed mid-upload never
    completes it, and a failed part fails the close."""
    try:
        out.close()
    except OSError:
        return  # not completed: nothing there
    with contextlib.suppress(OSError):
        fs.delete_file(final)


def _copy(target: DurableTarget, source_rel: str, rel: str) -> None:
    fs = target.filesystem
    if target.atomic_writes:
        fs.copy_file(target.path(source_rel), target.path(rel))
        return
    fs.create_dir(target.path(rel).rsplit("/", 1)[0], recursive=True)
    staged = target.staged(rel)
    try:
        fs.copy_file(target.path(source_rel), staged)
        fs.move(staged, target.path(rel))
    except BaseException:
        with contextlib.suppress(OSError):
            fs.delete_file(staged)
        raise


def _unchanged(fd: int, seen: Seen) -> None:
    if Seen.of(seen.rel, os.fstat(fd)).version != seen.version:
        raise SourceChangedError(
            errno.EAGAIN, "changed while it was uploaded; the next drain pass takes it", seen.rel
        )


def _check_size(target: DurableTarget, rel: str, size: int) -> None:
    [info] = target.filesystem.get_file_info([target.path(rel)])
    if info.type != pafs.FileType.File or info.size != size:
        raise ChecksumError(
            errno.EBADMSG,
            f"the durable tier holds {info.size} bytes ({info.type}) after an upload of "
            f"{size}; it is uploaded again by the next drain pass",
            target.path(rel),
        )
