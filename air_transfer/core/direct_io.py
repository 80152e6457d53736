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

``O_DIRECT`` needs the buffer address, the file offset and the length aligned to the
device's block size, which bytes fetched from the object store are not, so they are
copied into page-aligned bounce buffers that a thread writes out while the next one
fills. Files under ``MIN_DIRECT_FILE_BYTES`` go through the page cache.

Plain Python (Linux; elsewhere every file goes through the page cache): unit-tested
without Ray.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import queue
import threading

import numpy as np

from air_transfer.errors import error_at

#: Alignment of direct writes: a page covers every common logical block size
#: (512 B and 4 KiB); ``statx`` ``DIOALIGN`` is not exposed before Python 3.14.
ALIGN = 4096
#: Size of one bounce buffer: measured here, 8 MiB direct writes run at full disk
#: speed, and three of them keep private memory far below one chunk.
BOUNCE_BYTES = 8 * 1024 * 1024
#: Files smaller than this always go through the page cache: the whole file is a
#: write or two, and the cache serves the reader that follows.
MIN_DIRECT_FILE_BYTES = 16 * 1024 * 1024

logger = logging.getLogger(__name__)

_O_DIRECT: int = getattr(os, "O_DIRECT", 0)


def should_write_direct(size: int, enabled: bool = True) -> bool:
    """Whether a file of ``size`` bytes is written with ``O_DIRECT``: if ``enabled``,
    the platform has it, and the file has at least ``MIN_DIRECT_FILE_BYTES``."""
    return enabled and bool(_O_DIRECT) and size >= MIN_DIRECT_FILE_BYTES


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
            self.direct = _enable_direct(self.fd)
        except OSError as e:
            os.close(self.fd)
            raise error_at(e, path, "enabling O_DIRECT") from e
        self._free: queue.Queue[np.ndarray] = queue.Queue()
        for _ in range(depth):
            self._free.put(_aligned_buffer(buffer_bytes))
        self._full: queue.Queue[tuple[np.ndarray, int, int] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._buffer: np.ndarray | None = None
        self._fill = 0
        self._offset = 0  # file offset of the current buffer's first byte
        self._written = 0  # bytes the thread has written
        self._closed = False
        # A daemon: a writer abandoned without close() must not keep the process alive.
        self._thread = threading.Thread(
            target=self._drain,
            name=f"air-transfer direct write {os.path.basename(path)}",
            daemon=True,
        )
        self._thread.start()

    def write(self, data: memoryview) -> None:
        """Append ``data`` (a byte view) to the file."""
        view = memoryview(data).cast("B")
        while view:
            if self._error is not None:
                self.abort()
                self._raise_if_failed()
            if self._buffer is None:
                self._buffer = self._free.get()
            take = min(len(self._buffer) - self._fill, len(view))
            # numpy copies without the GIL (a slice assignment into an mmap or
            # bytearray holds it), so the writing thread is never kept waiting.
            source = np.frombuffer(view[:take], np.uint8)
            np.copyto(self._buffer[self._fill : self._fill + take], source)
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
        self._full.put((self._buffer, nbytes, self._offset))
        self._offset += self._fill
        self._buffer, self._fill = None, 0

    def _drain(self) -> None:
        while (item := self._full.get()) is not None:
            buffer, nbytes, offset = item
            try:
                if self._error is None:
                    self._pwrite_all(buffer, nbytes, offset)
                    self._written += nbytes
            except BaseException as e:  # re-raised in the caller's thread, never lost
                self._error = e
            finally:
                self._free.put(buffer)

    def _pwrite_all(self, buffer: np.ndarray, nbytes: int, offset: int) -> None:
        done = 0
        while done < nbytes:
            try:
                done += os.pwrite(self.fd, buffer[done:nbytes], offset + done)
            except OSError as e:
                if e.errno != errno.EINVAL or not self.direct:
                    raise
                _refused(self.path, "a write")
                self.direct = _disable_direct(self.fd)  # refused: page cache from here on

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


def pwrite_direct(path: str, data: memoryview, offset: int) -> bool:
    """Write ``data`` at ``offset`` of the existing file ``path`` with ``O_DIRECT``,
    through page-aligned bounce buffers, and return True; or return False where that
    cannot be done: an ``offset`` or length that is not a multiple of ``ALIGN``, a
    platform without ``O_DIRECT``, a filesystem that refuses it (``EINVAL``), a short
    write off a block boundary. The caller then writes all of ``data`` through the
    page cache; any part already written gets the same bytes again.

    For writers that place whole chunks at known offsets, possibly out of order and
    from several threads (node-storage uploads), where ``DirectFileWriter``'s front
    to back stream does not fit. Other errors (``ENOSPC``, ``EIO``) are raised.
    """
    view = memoryview(data).cast("B")
    if not _O_DIRECT or offset % ALIGN or len(view) % ALIGN:
        return False
    try:
        fd = os.open(path, os.O_WRONLY | _O_DIRECT | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.EINVAL:
            _refused(path, "the open")
            return False
        raise  # names the path
    try:
        bounce = _aligned_buffer(min(BOUNCE_BYTES, len(view)))
        done = 0
        while done < len(view):
            n = min(len(bounce), len(view) - done)
            np.copyto(bounce[:n], np.frombuffer(view[done : done + n], np.uint8))
            written = 0
            while written < n:
                step = os.pwrite(fd, bounce[written:n], offset + done + written)
                if step <= 0 or step % ALIGN:  # not resumable with O_DIRECT
                    logger.debug("air-transfer: a short O_DIRECT write of %s: %d bytes", path, step)
                    return False
                written += step
            done += n
    except OSError as e:
        if e.errno == errno.EINVAL:
            _refused(path, "a write")
            return False
        raise error_at(e, path, f"writing at offset {offset}") from e
    finally:
        os.close(fd)
    return True


def _aligned_buffer(nbytes: int) -> np.ndarray:
    """``nbytes`` of private memory starting on an ``ALIGN`` boundary."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]


def _enable_direct(fd: int) -> bool:
    if not _O_DIRECT:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | _O_DIRECT)
    except OSError as e:
        if e.errno == errno.EINVAL:
            _refused(f"descriptor {fd}", "fcntl(O_DIRECT)")
            return False
        raise
    return True


_refusals_logged: set[str] = set()


def _refused(where: str, what: str) -> None:
    """Log that the filesystem refused ``O_DIRECT`` (once per directory at warning:
    writes there are slower and fill the page cache; the rest at debug)."""
    directory = os.path.dirname(where) or where
    level = logging.DEBUG if directory in _refusals_logged else logging.WARNING
    _refusals_logged.add(directory)
    logger.log(
        level,
        "air-transfer: the filesystem of %s refused O_DIRECT (%s); writing through the "
        "page cache instead",
        where,
        what,
    )


def _disable_direct(fd: int) -> bool:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
    return False
