"""Read a checkpoint's files into chunk buffers, proving every byte is of the version
the scan described: each span is read between two ``fstat``s of its open file, both
equal to the scan's ``Stamp``, else SourceChangedError names the file and the chunk
is never handed out (why this proves a version, and what it cannot see:
``docs/design.md``, "What a checksum proves"). Plain Python, shared by every strategy:
``fill_chunk`` fills one buffer from its plan, opening the files itself;
``read_chunks`` fills chunks in order, keeping the current file open.
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import time
from collections.abc import Callable, Generator, Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from air_transfer.core.entry import Entry
from air_transfer.core.plan import ChunkPlan, Span, plan_chunks
from air_transfer.core.scan import Source, Stamp
from air_transfer.errors import SourceChangedError

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
_after_span_read: Callable[[str, Span], None] | None = None


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
        for span, (path, stamp) in zip(plan.spans, plan.files, strict=True):
            view = out[span.chunk_offset : span.chunk_offset + span.length]
            files.open(path, stamp).read_span(span, view)
    finally:
        if own:
            files.close()


class FileCursor:
    """The file the last span came from, kept open: a large file spans many chunks,
    and reopening it for each would cost a path lookup and a fresh readahead."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.current: SourceFile | None = None

    def open(self, path: str, stamp: Stamp) -> SourceFile:
        if self.current is None or self.current.path != path:
            self.close()
            self.current = SourceFile(self.source, path, stamp)
        return self.current

    def close(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            current.close()

    def __enter__(self) -> FileCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SourceFile:
    """One source file open for reading, checked against its scan stamp."""

    def __init__(self, source: Source, path: str, stamp: Stamp) -> None:
        self.source, self.path, self.stamp = source, path, stamp
        self.where = f"{source.root.rstrip('/')}/{path}"
        self.local = source.is_local
        #: What ``check`` compares ``fstat`` with: the whole stamp, or for a file never
        #: written in place (node storage) its version alone, so that a hard link made
        #: or dropped by another checkpoint meanwhile is no change of its bytes.
        self.stored = source.replaced_not_rewritten
        # Before any byte of it is read (nothing to wait for without a ctime).
        if stamp.ctime_ns is not None and time.time_ns() - stamp.ctime_ns < RACY_WINDOW_NS:
            _wait_out_racy_window(stamp.ctime_ns)
        try:
            self.handle: io.FileIO | pa.NativeFile = source.open(path)
        except FileNotFoundError as e:
            if self.stored:  # its checkpoint was deleted: nothing else changes one
                raise FileNotFoundError(
                    errno.ENOENT,
                    f"checkpoint file {self.where!r} was deleted after its directory was "
                    "scanned (the checkpoint was deleted); restore another checkpoint",
                    self.where,
                ) from e
            raise _vanished(self.where) from e
        self.fd = self.handle.fileno() if self.local else -1
        self.position = 0
        self.checked = False

    def read_span(self, span: Span, view: memoryview) -> None:
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
            check_stat(self.where, self.stamp, os.fstat(self.fd), self.stored)
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


def check_stat(where: str, stamp: Stamp, st: os.stat_result, stored: bool = False) -> None:
    """Raise SourceChangedError unless ``st`` (of local file ``where``) is the file as
    scanned (``stamp``); a ``stored`` one (never written in place:
    ``Source.replaced_not_rewritten``) by its size, mtime, inode and device alone."""
    if stored:
        if (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev) != (
            stamp.size,
            stamp.mtime_ns,
            stamp.ino,
            stamp.dev,
        ):
            raise _changed(where, stamp, Stamp.of_stat(st))
        return
    # A plain tuple compares equal to the Stamp (a NamedTuple) field by field,
    # without building one: this runs twice per span.
    if (
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
        st.st_ino,
        st.st_dev,
        st.st_nlink,
    ) != stamp:
        raise _changed(where, stamp, Stamp.of_stat(st))


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
