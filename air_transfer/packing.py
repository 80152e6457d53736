"""Read a checkpoint's files into chunk buffers, proving every byte is of the version
the scan described.

Plain Python (no Ray), shared by every strategy: a strategy decides where a filled
chunk goes (one big object, one object per chunk, a stream), this module fills it.
Files are read with ``readinto`` straight into the caller's buffer, never through an
intermediate ``bytes``.

The unit is one chunk: ``plan_chunks`` says which file spans chunk ``i`` carries
(path, offsets and the file's scan ``Stamp``), and ``fill_chunk`` fills one buffer
from its plan, opening the files itself, so a chunk can be filled in another process
from a plan alone. ``read_chunks`` and ``read_chunks_ahead`` fill chunks in order on
top of it, keeping the current file open from one chunk to the next.

Why a checksum proves "a version of the source": a checksum is taken of whatever was
read, so a file rewritten in place while it is read would be packed torn (bytes of
neither version, a valid checksum). So every span is read between two observations of
its file, ``fstat`` of the open fd before and after, and both must equal the stamp
the scan took (size, mtime_ns, ctime_ns, inode, device, link count); otherwise
SourceChangedError names the file and the chunk is never handed out. A write call
sets ctime (and mtime) as it starts, so one that starts after the scan shows in the
next fstat; a rename over the file or its removal drops the open inode's link count;
a rename before the open changes the inode. The mtime in the manifest is the scan's,
which this proves is the mtime of the bytes.

A write that leaves all of these unchanged: same size, and within the same tick of
the kernel's coarse clock that stamps ctime (``RACY_WINDOW_NS``, like git's "racily
clean" rule). A file whose scanned ctime is that recent is read only once the window
has passed, so any write from the read's start on gets a strictly later ctime. Files
not changed in the last window pay one clock read per file.

Residual limits (a change these checks cannot see):
- Filesystems whose timestamps are coarser than the window (1 s or 2 s on some NFS
  servers, SMB, FAT): a same-size rewrite within the same second as the scan, racing
  the read, keeps every field. Timestamps set by a server with a skewed clock void
  the window too (the wait is capped at one window).
- One write call of the same size in place that started before the scan and is
  still copying more than the window later (its times were set as it started): a
  single huge ``write``, or one stalled by dirty-page throttling. Writes that
  truncate or extend the file change its size as they go.
- Stores through a shared ``mmap`` update the times only when a clean page is first
  written, not for every store into an already dirty page.
- A clock stepped back by more than the window between the write and the read.
- Non-local pyarrow filesystems (S3, GCS, ...) report only size and mtime (often to
  the second) and no identity: a same-size replacement within the same mtime is not
  seen there. Their files are checked with ``get_file_info`` when opened and after
  every span; no waiting, since their mtime granularity makes a window moot.
"""

from __future__ import annotations

import errno
import os
import posixpath
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow.fs as pafs

from air_transfer.errors import SourceChangedError
from air_transfer.layout import Source, Stamp, iter_chunk_spans
from air_transfer.manifest import Entry, chunk_checksum

#: How recent a file's scanned ctime may be for its read to start right away. Linux
#: stamps ctime/mtime from a coarse clock that lags real time by at most one tick
#: (10 ms at HZ=100, the slowest common setting); twice that leaves a margin. Once
#: real time is past ctime + this window, any later write gets a strictly later
#: ctime, which the after-read fstat sees. (Kernels with multigrain timestamps, 6.13+
#: on ext4/xfs/btrfs/tmpfs, never reuse a queried ctime; the wait is harmless there.)
RACY_WINDOW_NS = 20_000_000

#: Test-only seam, None in production: called as ``hook(path, span)`` after a span's
#: bytes are read and before the after-read fstat, so tests can interleave a write
#: with a read deterministically.
_after_span_read: Callable[[str, FileSpan], None] | None = None


class FileSpan(NamedTuple):
    """``length`` bytes of the file ``path`` (relative to the source root) from
    ``file_offset``, found at ``chunk_offset`` in their chunk; ``stamp`` is the file
    as scanned, which the read must prove unchanged. (A NamedTuple: one is made per
    file per chunk, and a frozen dataclass costs several times more to build.)"""

    path: str
    stamp: Stamp
    file_offset: int
    length: int
    chunk_offset: int


@dataclass(frozen=True)
class ChunkPlan:
    """Chunk ``index``: ``length`` bytes made of ``spans``. Small and picklable, so
    a chunk can be filled in another process from its plan and the source alone."""

    index: int
    length: int
    spans: tuple[FileSpan, ...]


def plan_chunks(
    files: Sequence[Entry],
    stamps: Sequence[Stamp],
    chunk_bytes: int,
    start_chunk: int = 0,
    stop_chunk: int | None = None,
) -> Iterator[ChunkPlan]:
    """The plans of chunks ``start_chunk``..``stop_chunk - 1`` (default: to the end)
    of the stream of ``files``, whose scan stamps are ``stamps``. Lazy."""
    if len(stamps) != len(files):
        raise ValueError(f"{len(stamps)} stamps for {len(files)} files")
    sizes = [f.size for f in files]
    for f, s in zip(files, stamps, strict=True):
        if s.size != f.size:
            raise ValueError(f"stamp of {f.path!r} says {s.size} bytes, the entry {f.size}")
    total = sum(sizes)
    for index, spans in enumerate(iter_chunk_spans(sizes, chunk_bytes, start_chunk), start_chunk):
        if stop_chunk is not None and index >= stop_chunk:
            return
        yield ChunkPlan(
            index,
            min(chunk_bytes, total - index * chunk_bytes),
            tuple(
                FileSpan(
                    files[s.file_index].path,
                    stamps[s.file_index],
                    s.file_offset,
                    s.length,
                    s.chunk_offset,
                )
                for s in spans
            ),
        )


def fill_chunk(
    source: Source, plan: ChunkPlan, out: memoryview, cursor: FileCursor | None = None
) -> None:
    """Fill ``out`` (exactly ``plan.length`` bytes) with chunk ``plan.index``.

    Each span is read between two checks of its file against its stamp; a file that
    differs raises SourceChangedError naming it, and ``out`` must then be discarded.
    ``cursor`` keeps the last file open for the next call (sequential reading);
    without one, the files are opened and closed here.
    """
    if len(out) != plan.length:
        raise ValueError(f"chunk {plan.index} has {plan.length} bytes, buffer {len(out)}")
    own = cursor is None
    files = FileCursor(source) if cursor is None else cursor
    try:
        for span in plan.spans:
            view = out[span.chunk_offset : span.chunk_offset + span.length]
            files.open(span).read_span(span, view)
    finally:
        if own:
            files.close()


class FileCursor:
    """The file the last span came from, kept open: a large file spans many chunks,
    and reopening it for each would cost a path lookup and a fresh readahead."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.current: _SourceFile | None = None

    def open(self, span: FileSpan) -> _SourceFile:
        if self.current is None or self.current.path != span.path:
            self.close()
            self.current = _SourceFile(self.source, span.path, span.stamp)
        return self.current

    def close(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            current.close()

    def __enter__(self) -> FileCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _SourceFile:
    """One source file open for reading, checked against its scan stamp."""

    def __init__(self, source: Source, path: str, stamp: Stamp) -> None:
        self.source, self.path, self.stamp = source, path, stamp
        self.where = f"{source.root.rstrip('/')}/{path}"
        self.local = source.is_local
        # Before any byte of it is read (nothing to wait for without a ctime).
        if stamp.ctime_ns is not None and time.time_ns() - stamp.ctime_ns < RACY_WINDOW_NS:
            _wait_out_racy_window(stamp.ctime_ns)
        try:
            self.handle: Any = source.open(path)
        except FileNotFoundError as e:
            raise _vanished(self.where) from e
        self.fd = self.handle.fileno() if self.local else -1
        self.position = 0
        self.checked = False

    def read_span(self, span: FileSpan, view: memoryview) -> None:
        if self.local or not self.checked:
            self.check()  # remote: once per open (each check is a request)
            self.checked = True
        if span.file_offset != self.position:
            self._seek(span.file_offset)
        filled = 0
        while filled < len(view):
            n = self.handle.readinto(view[filled:])
            if not n:
                raise _error(
                    self.where,
                    f"shrank while being packed: scanned at {self.stamp.size} bytes, "
                    f"ended after {self.position + filled}",
                )
            filled += n
        self.position += filled
        hook = _after_span_read
        if hook is not None:
            hook(self.where, span)
        self.check()

    def check(self) -> None:
        """Raise SourceChangedError unless the file still looks as scanned."""
        if self.local:
            st = os.fstat(self.fd)
            # A plain tuple compares equal to the Stamp (a NamedTuple) field by
            # field, without building one: this runs twice per span.
            if (
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
                st.st_ino,
                st.st_dev,
                st.st_nlink,
            ) != self.stamp:
                raise _changed(self.where, self.stamp, Stamp.of_stat(st))
            return
        info = self.source.filesystem.get_file_info(self._remote_path())
        now = None if info.type == pafs.FileType.NotFound else Stamp.of_info(info)
        if now != self.stamp:
            raise _changed(self.where, self.stamp, now)

    def _remote_path(self) -> str:
        return posixpath.join(self.source.root, self.path)

    def _seek(self, offset: int) -> None:
        if self.local or self.handle.seekable():
            self.handle.seek(offset)
        else:  # a pyarrow input stream: reopen as a random-access file
            self.handle.close()
            self.handle = self.source.filesystem.open_input_file(self._remote_path())
            self.handle.seek(offset)
        self.position = offset

    def close(self) -> None:
        self.handle.close()


def _wait_out_racy_window(ctime_ns: int) -> None:
    """Sleep until real time is ``RACY_WINDOW_NS`` past the scanned ctime (at most one
    window, should the timestamp come from a clock ahead of ours)."""
    left = ctime_ns + RACY_WINDOW_NS - time.time_ns()
    if left > 0:
        time.sleep(min(left, RACY_WINDOW_NS) / 1e9)


def current_stamps(source: Source, files: Sequence[Entry]) -> list[Stamp]:
    """Stamps of ``files`` as they are now, for a read that has no scan to hold
    them to (node storage reads one file of a known size): the read is then proven
    to be of one version, the one found here."""
    stamps = []
    for f in files:
        where = f"{source.root.rstrip('/')}/{f.path}"
        if source.is_local:
            try:
                st = source.stat(f.path)
            except FileNotFoundError as e:
                raise _vanished(where) from e
            now = Stamp.of_stat(st)
        else:
            info = source.filesystem.get_file_info(posixpath.join(source.root, f.path))
            if info.type == pafs.FileType.NotFound:
                raise _vanished(where)
            now = Stamp.of_info(info)
        if now.size != f.size:
            raise _changed(where, now._replace(size=f.size), now)
        stamps.append(now)
    return stamps


def _error(where: str, what: str, code: int = errno.EAGAIN) -> SourceChangedError:
    # EAGAIN ("try again"): the remedy for a file that is still being written.
    return SourceChangedError(code, f"checkpoint file {where!r} {what}", where)


def _vanished(where: str) -> SourceChangedError:
    return _error(where, "vanished after the directory was scanned", errno.ENOENT)


def _changed(where: str, scanned: Stamp, now: Stamp | None) -> SourceChangedError:
    if now is None:
        return _vanished(where)
    if now.size < scanned.size:
        return _error(
            where,
            f"shrank while being packed: scanned at {scanned.size} bytes, now {now.size}",
        )
    if now.size > scanned.size:
        return _error(
            where,
            f"grew while being packed: scanned at {scanned.size} bytes, now {now.size}; "
            "re-pack once it is stable",
        )
    if (now.ino, now.dev) != (scanned.ino, scanned.dev):
        return _error(
            where,
            "was replaced by another file (a new inode) after the directory was scanned; "
            "re-pack once it is stable",
        )
    fields = [
        name
        for name, old, new in zip(Stamp._fields, scanned, now, strict=True)
        if old != new and name in ("mtime_ns", "ctime_ns", "nlink")
    ]
    return _error(
        where,
        f"changed after the directory was scanned: same size, but its "
        f"{'/'.join(fields)} differ from the scan (rewritten in place, touched, or "
        "renamed over or removed); re-pack once it is stable",
    )


def read_chunks(
    source: Source,
    files: Sequence[Entry],
    stamps: Sequence[Stamp],
    chunk_bytes: int,
    buffer_for: Callable[[int, int], memoryview],
    start_chunk: int = 0,
    stop_chunk: int | None = None,
) -> Generator[tuple[int, memoryview], None, None]:
    """Yield ``(index, view)`` for chunks ``start_chunk``..``stop_chunk - 1`` (default:
    to the end), each filled with the stream's bytes and proven against ``stamps``
    (``fill_chunk``).

    ``buffer_for(index, length)`` supplies a writable buffer of exactly ``length``
    bytes; the caller owns it and may reuse it once it moves on.
    """
    with FileCursor(source) as cursor:
        for plan in plan_chunks(files, stamps, chunk_bytes, start_chunk, stop_chunk):
            view = buffer_for(plan.index, plan.length)
            fill_chunk(source, plan, view, cursor)
            yield plan.index, view


_DONE = object()


def read_chunks_ahead(
    source: Source,
    files: Sequence[Entry],
    stamps: Sequence[Stamp],
    chunk_bytes: int,
    start_chunk: int = 0,
    stop_chunk: int | None = None,
    checksums: bool = True,
) -> Iterator[tuple[int, memoryview, str]]:
    """Yield ``(index, view, checksum)`` for every chunk, reading and hashing the next
    chunk in a background thread while the caller stores the current one (without
    ``checksums`` the checksum is "": a copy that never leaves the process).

    A ring of three reusable buffers bounds memory at ``3 x chunk_bytes``: the thread
    fills one while one waits in the hand-off queue and the caller holds the third.
    A view is valid until the caller asks for the next chunk.
    """
    size = min(chunk_bytes, sum(f.size for f in files))
    ring = [np.empty(size, dtype=np.uint8) for _ in range(3)]
    handoff: queue.Queue[Any] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def offer(item: Any) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            chunks = read_chunks(
                source,
                files,
                stamps,
                chunk_bytes,
                lambda i, n: memoryview(ring[i % 3])[:n],
                start_chunk,
                stop_chunk,
            )
            for index, view in chunks:
                checksum = chunk_checksum(view) if checksums else ""
                if not offer((index, view, checksum)):
                    chunks.close()
                    return
            offer(_DONE)
        except BaseException as e:  # handed to the caller's thread and re-raised there
            offer(e)

    thread = threading.Thread(target=produce, name="air-transfer-pack", daemon=True)
    thread.start()
    try:
        while True:
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


class ChunkPacker:
    """Fills chunks from their plans (a few per call, from any number of threads) into
    a reusable buffer per thread, and checksums them.

    For the node agent, which packs every chunk of every transfer on its node as one
    task each: a fresh chunk-sized buffer per task would fault in new pages every
    time (~8k page faults per 32 MiB chunk). The view ``pack`` returns stays valid
    until the same thread packs again; Ray stores a task's return value in the object
    store in the thread that ran the task, before that thread runs another, so an
    actor method may return it directly. Memory: one buffer per packing thread.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def _buffer(self, length: int) -> np.ndarray:
        buffer: np.ndarray | None = getattr(self._local, "buffer", None)
        if buffer is None or len(buffer) < length:
            buffer = self._local.buffer = np.empty(length, dtype=np.uint8)
        return buffer[:length]

    def pack(
        self, source: Source, plans: Sequence[ChunkPlan]
    ) -> tuple[list[np.ndarray], list[str]]:
        """The chunks of ``plans`` of ``source`` and their checksums, each proven
        against its plan's stamps (SourceChangedError otherwise); one buffer holds
        them all, so they stay valid together until this thread packs again."""
        buffer = self._buffer(sum(plan.length for plan in plans))
        chunks, checksums = [], []
        offset = 0
        with FileCursor(source) as cursor:
            for plan in plans:
                chunk = buffer[offset : offset + plan.length]
                fill_chunk(source, plan, memoryview(chunk), cursor)
                chunks.append(chunk)
                checksums.append(chunk_checksum(chunk))
                offset += plan.length
        return chunks, checksums

    def checksums(self, source: Source, plans: Sequence[ChunkPlan]) -> list[str]:
        """Only the checksums of ``plans``' chunks (``streamed`` reads the bytes again
        at transfer time), through one chunk buffer."""
        return [self.pack(source, [plan])[1][0] for plan in plans]
