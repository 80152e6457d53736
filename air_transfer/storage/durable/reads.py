"""Reading the durable tier where node storage does not hold a path: what a path is,
what a directory lists (less what a pending delete took and the tier's own names),
and a file's bytes, each chunk verified against the file's record.

A file is read in whole chunks of its record (``records``), one ranged read each
(tens of MiB: pyarrow's own reads of an S3 object are small), so a rank of a torch
DCP load reads the chunks its byte ranges fall in, and every byte it gets was
checked. A chunk that does not match raises ChecksumError naming the file and the
chunk; nothing of it is returned.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator

import pyarrow.fs as pafs

from air_transfer.cluster.agent_client import Info, Listed
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.reader import ChunkFileReader
from air_transfer.errors import ChecksumError
from air_transfer.storage.durable.records import FileRecord, read_record
from air_transfer.storage.durable.target import META_DIR, DurableTarget, is_staged
from air_transfer.storage.durable.tombstones import covered

NOT_FOUND: Info = (pafs.FileType.NotFound, None, None)
_counted = threading.Lock()
_bytes_read = 0


def bytes_read() -> int:
    """Bytes this process has read from durable tiers' files so far (each chunk
    read counted once): what a restore that reads through cost."""
    return _bytes_read


#: Chunk size of a file read without a record (written there by someone else).
UNRECORDED_CHUNK_BYTES = 32 * 1024 * 1024


def hidden(rel: str) -> bool:
    """Whether ``rel`` is one of the tier's own names (records, staged uploads)."""
    return (
        rel == META_DIR
        or rel.startswith(META_DIR + "/")
        or any(is_staged(part) for part in rel.split("/"))
    )


def infos(target: DurableTarget, rels: list[str], deleted: set[str]) -> list[Info]:
    """What each of ``rels`` is in the durable tier, as a reader of node storage sees
    it: not found where a pending delete covers it or it is one of the tier's own."""
    shown = [i for i, rel in enumerate(rels) if not hidden(rel) and not covered(rel, deleted)]
    out = [NOT_FOUND] * len(rels)
    if shown:
        found = target.filesystem.get_file_info([target.path(rels[i]) for i in shown])
        for i, info in zip(shown, found, strict=True):
            out[i] = (info.type, info.size, info.mtime_ns)
    return out


def listing(target: DurableTarget, base: str, recursive: bool, deleted: set[str]) -> list[Listed]:
    """``(path relative to base, type, size, mtime_ns)`` under ``base`` in the
    durable tier, less what a pending delete covers and the tier's own names; empty
    if it is not there."""
    if covered(base, deleted) or hidden(base):
        return []
    selector = pafs.FileSelector(target.path(base), recursive=recursive, allow_not_found=True)
    try:
        found = target.filesystem.get_file_info(selector)
    except NotADirectoryError:
        return []
    prefix = target.path(base) + "/"
    out: list[Listed] = []
    for info in found:
        inner = info.path[len(prefix) :]
        rel = f"{base}/{inner}" if base else inner
        if inner and not hidden(rel) and not covered(rel, deleted):
            out.append((inner, info.type, info.size, info.mtime_ns))
    return out


def open_verified(target: DurableTarget, rel: str, size: int) -> ChunkFileReader:
    """A seekable stream over the durable tier's file ``rel`` of ``size`` bytes,
    each chunk checked against the file's record (its size alone if it has none)."""
    record = read_record(target, rel)
    if record is not None and record.size != size:
        raise ChecksumError(
            errno.EBADMSG,
            f"the durable tier's file is {size} bytes but its record says {record.size}: "
            "it was replaced by something else than the drain",
            target.path(rel),
        )
    chunk_bytes = record.chunk_bytes if record is not None else UNRECORDED_CHUNK_BYTES
    source = target.filesystem.open_input_file(target.path(rel))

    def chunks(first: int, _last: int) -> Iterator[tuple[int, memoryview]]:
        index = first
        while index * chunk_bytes < size:
            yield index, _chunk(target, rel, source, record, index, chunk_bytes, size)
            index += 1

    return ChunkFileReader(target.path(rel), size, 0, chunk_bytes, chunks)


def _chunk(
    target: DurableTarget,
    rel: str,
    source: pafs.NativeFile,
    record: FileRecord | None,
    index: int,
    chunk_bytes: int,
    size: int,
) -> memoryview:
    offset = index * chunk_bytes
    length = min(chunk_bytes, size - offset)
    data = memoryview(source.read_at(length, offset)).cast("B")
    global _bytes_read
    with _counted:
        _bytes_read += len(data)
    if len(data) != length or (record is not None and chunk_checksum(data) != record.sums[index]):
        raise ChecksumError(
            errno.EBADMSG,
            f"chunk {index} ({len(data)} bytes at offset {offset}, expected {length}) of "
            "the durable tier's file does not match the checksum the drain recorded; "
            "nothing of it was returned",
            target.path(rel),
        )
    return data
