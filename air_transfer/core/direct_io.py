"""Writing large files around the page cache (``O_DIRECT``).

Why: on the 2-core / 24 GiB VM this project is measured on, writing a 4 GiB file
through the page cache took anywhere from 1.6 s to 7 s. Past the kernel's dirty
threshold the writer is throttled to the writeback rate (about 0.7 GB/s there), and
on a VM that hands freed memory back to its host (virtio free page reporting) every
new page-cache page first costs a host fault: a 1 GiB write took 0.2 s right after
another one and 1.3-2.3 s after two idle seconds. The same 4 GiB written with
``O_DIRECT`` took 1.05-1.2 s every time, linear in size (0.26-0.30 s/GiB). A first
version went direct only for files that would pass the kernel's background writeback
threshold; measured in the round trip, the page-cache writes it kept for 0.5-1 GB
files took 0.48-1.70 s per GB against 0.52-0.55 s direct, so every large file goes
direct.

``O_DIRECT`` needs the file offset and length aligned to the device's block size and
the buffer to its DMA alignment. A view of the object store written at an aligned
offset goes straight from the store's memory when its address is ``MEM_ALIGN``
aligned (the store aligns buffers to 64 bytes: about one chunk in eight); other
bytes are copied into page-aligned bounce buffers, in pieces that are hashed right
after the copy while they are in cache (verify and copy in one pass over memory),
and a thread writes full buffers out while the next one fills. Files under
``MIN_DIRECT_FILE_BYTES`` go through the page cache.

Plain Python (Linux; elsewhere every file goes through the page cache): unit-tested
without Ray.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from typing import TYPE_CHECKING, Protocol

import numpy as np

from air_transfer.core.aligned_writes import (
    ALIGN,
    BOUNCE_BYTES,
    MIN_DIRECT_FILE_BYTES,
    aligned_buffer,
    disable_direct,
    enable_direct,
    pwrite_direct,
    refused,
    should_write_direct,
)
from air_transfer.core.threads import start_daemon
from air_transfer.errors import error_at

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

__all__ = [
    "ALIGN",
    "BOUNCE_BYTES",
    "MIN_DIRECT_FILE_BYTES",
    "DirectFileWriter",
    "Hasher",
    "pwrite_direct",
    "should_write_direct",
]


class Hasher(Protocol):
    """A streaming hash (``xxhash.xxh3_128``): what ``write`` feeds every byte to."""

    def update(self, data: Buffer, /) -> None: ...


#: Buffer address alignment of a direct write (a block queue's DMA alignment: 511 + 1
#: on common disks); a write refused for it retries through a bounce buffer.
MEM_ALIGN = 512
#: Bytes copied into a bounce buffer and then hashed at a time (cache-resident).
PIECE_BYTES = 1024 * 1024
#: Shortest view written straight from its buffer (below, a copy costs little).
DIRECT_VIEW_MIN_BYTES = 1024 * 1024


class DirectFileWriter:
    """Writes one file front to back with ``O_DIRECT``: ``write`` copies into an
    aligned bounce buffer, a thread writes full buffers out while the next one fills,
    ``close`` writes the padded tail and truncates the file to its true length.

    If the filesystem refuses direct I/O (``EINVAL``: tmpfs on older kernels, some
    network and FUSE filesystems), the file quietly continues through the page cache.
    """

    def __init__(
        self, path: str, buffer_bytes: int = BOUNCE_BYTES, depth: int = 3, fd: int | None = None
    ) -> None:
        """``fd``: the file ``path`` already open for writing (the writer takes it
        over and truncates it), where opening it by path again would not be safe."""
        if buffer_bytes <= 0 or buffer_bytes % ALIGN:  # checked before the file is made
            if fd is not None:
                os.close(fd)
            raise ValueError(
                f"bounce buffer size {buffer_bytes} must be a positive multiple of {ALIGN}"
            )
        self.path = path
        if fd is None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        else:
            try:
                os.ftruncate(fd, 0)
            except OSError as e:
                os.close(fd)
                raise error_at(e, path, "truncating it") from e
        self.fd = fd
        try:
            self.direct = enable_direct(self.fd)
        except OSError as e:
            os.close(self.fd)
            raise error_at(e, path, "enabling O_DIRECT") from e
        self._free: queue.Queue[np.ndarray] = queue.Queue()
        for _ in range(depth):
            self._free.put(aligned_buffer(buffer_bytes))
        #: (buffer, bytes, offset, set once written): a bounce buffer, or a view
        #: written from in place (with an event where its caller waits for it).
        self._full: queue.Queue[
            tuple[memoryview | np.ndarray, int, int, threading.Event | None] | None
        ]
        self._full = queue.Queue()
        self._views = threading.Semaphore(depth)
        self._mem_align = MEM_ALIGN
        self._error: BaseException | None = None
        self._buffer: np.ndarray | None = None
        self._fill = 0
        self._offset = 0  # file offset of the current buffer's first byte
        self._written = 0  # bytes the thread has written
        self._closed = False
        # A daemon: a writer abandoned without close() must not keep the process alive.
        self._thread = start_daemon(
            f"air-transfer direct write {os.path.basename(path)}", self._drain
        )

    def write(self, data: memoryview, hasher: Hasher | None = None, *, kept: bool = False) -> None:
        """Append ``data`` (a byte view) to the file; ``hasher``, if given, is updated
        with every byte, from the bounce buffer right after it is filled (in cache).

        ``kept``: the caller leaves ``data`` unchanged until ``close()`` (an
        object-store chunk, which the queued view pins), so its aligned middle may be
        written from in place after ``write`` returns. Otherwise (a reused read-ahead
        buffer, a caller's ``bytearray``) ``write`` returns only once nothing refers
        to ``data`` any more: a buffer refilled while a queued write still pointed at
        it would put later bytes into this file, unseen by any check."""
        view = memoryview(data).cast("B")
        head = self._direct_head(view)
        if head is not None:  # straight from ``view`` after ``head`` bytes
            self._bounce(view[:head], hasher)
            view = view[head:]
            if self._fill:
                self._submit(self._fill)  # a multiple of ALIGN: the offset is aligned
            n = len(view) - len(view) % ALIGN
            done = None if kept else threading.Event()
            self._views.acquire()  # at most ``depth`` views queued (they pin chunks)
            self._full.put((view[:n], n, self._offset, done))
            if hasher is not None:  # while the thread writes the same bytes
                hasher.update(view[:n])
            self._offset += n
            view = view[n:]
            if done is not None:
                done.wait()
        self._bounce(view, hasher)

    def _direct_head(self, view: memoryview) -> int | None:
        """How many bytes of ``view`` to copy before the rest can be written from
        ``view`` itself (at an ALIGN offset, from a ``MEM_ALIGN`` address); None
        where it cannot."""
        if not self.direct or len(view) < DIRECT_VIEW_MIN_BYTES:
            return None
        head = -(self._offset + self._fill) % ALIGN
        address = np.frombuffer(view, np.uint8).ctypes.data + head
        return None if address % self._mem_align else head

    def _bounce(self, view: memoryview, hasher: Hasher | None) -> None:
        while view:
            if self._error is not None:
                self.abort()
                self._raise_if_failed()
            if self._buffer is None:
                self._buffer = self._free.get()
            take = min(len(self._buffer) - self._fill, len(view), PIECE_BYTES)
            # numpy copies without the GIL (a slice assignment into an mmap or
            # bytearray holds it), so the writing thread is never kept waiting.
            piece = self._buffer[self._fill : self._fill + take]
            np.copyto(piece, np.frombuffer(view[:take], np.uint8))
            if hasher is not None:
                hasher.update(piece)
            self._fill += take
            view = view[take:]
            if self._fill == len(self._buffer):
                self._submit(self._fill)

    def close(self) -> None:
        """Write what is buffered, wait for the thread, truncate, close; re-raise a
        write error (the file is then incomplete and the caller discards it)."""
        if self._closed:
            return
        try:
            tail = self._fill
            length = self._offset + tail
            padded = -(-tail // ALIGN) * ALIGN
            if tail and self._error is None:
                assert self._buffer is not None
                self._buffer[tail:padded] = 0
                self._submit(padded)
            self._stop()
            if padded != tail and self._error is None:
                try:
                    os.ftruncate(self.fd, length)  # cut the tail's zero padding off
                except OSError as e:
                    raise error_at(e, self.path, f"cutting it to {length} bytes") from e
        finally:
            self._release()
        self._raise_if_failed()

    def abort(self) -> None:
        """Stop without finishing the file (the caller deletes it)."""
        if self._closed:
            return
        try:
            self._stop()
        finally:
            self._release()

    def __enter__(self) -> DirectFileWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _submit(self, nbytes: int) -> None:
        assert self._buffer is not None
        self._full.put((self._buffer, nbytes, self._offset, None))
        self._offset += self._fill
        self._buffer, self._fill = None, 0

    def _drain(self) -> None:
        while (item := self._full.get()) is not None:
            buffer, nbytes, offset, done = item
            del item  # a view is referenced by ``buffer`` alone, dropped before ``done``
            try:
                if self._error is None:
                    if isinstance(buffer, memoryview):
                        self._pwrite_view(buffer, offset)
                    else:
                        self._pwrite_all(buffer, nbytes, offset)
                    self._written += nbytes
            except BaseException as e:  # re-raised in the caller's thread, never lost
                self._error = e
            finally:
                if isinstance(buffer, memoryview):
                    del buffer  # the last reference: the caller may reuse its memory
                    self._views.release()
                    if done is not None:
                        done.set()
                else:
                    self._free.put(buffer)
                    del buffer

    def _pwrite_view(self, view: memoryview, offset: int) -> None:
        """Write ``view`` from where it is; where the kernel refuses its address
        (``EINVAL``), through a bounce buffer, and only page-aligned views after."""
        try:
            written = os.pwrite(self.fd, view, offset)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            written, self._mem_align = 0, ALIGN
        if written == len(view):
            return
        bounce = aligned_buffer(min(BOUNCE_BYTES, len(view)))
        while written < len(view):
            n = min(len(bounce), len(view) - written)
            np.copyto(bounce[:n], np.frombuffer(view[written : written + n], np.uint8))
            self._pwrite_all(bounce, n, offset + written)
            written += n

    def _pwrite_all(self, buffer: np.ndarray, nbytes: int, offset: int) -> None:
        done = 0
        while done < nbytes:
            try:
                done += os.pwrite(self.fd, buffer[done:nbytes], offset + done)
            except OSError as e:
                if e.errno != errno.EINVAL or not self.direct:
                    raise
                refused(self.path, "a write")
                self.direct = disable_direct(self.fd)  # refused: page cache from here on

    def _raise_if_failed(self) -> None:
        """Raise the writing thread's error here: an OSError keeps its errno (ENOSPC
        stays ENOSPC) and names the file; anything else is raised as it was."""
        error = self._error
        if isinstance(error, OSError):
            raise error_at(error, self.path, f"writing it after {self._written} bytes") from error
        if error is not None:
            raise error

    def _stop(self) -> None:
        self._full.put(None)
        self._thread.join()

    def _release(self) -> None:
        self._closed = True
        os.close(self.fd)  # the thread has stopped: no write is in flight
        self._buffer = None
        while not self._free.empty():
            self._free.get_nowait()
