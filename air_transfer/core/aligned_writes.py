"""The plain parts of ``O_DIRECT`` writing (why it is used: ``core.direct_io``): the
alignment, aligned buffers, switching a descriptor to it and back, logging a
filesystem that refuses it, ``pwrite_direct`` for chunks at known offsets, and its
one reading twin, ``pread_direct`` (a stored chunk read to be reused)."""

from __future__ import annotations

import errno
import fcntl
import logging
import os

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
logger = logging.getLogger("air_transfer.core.direct_io")

_O_DIRECT: int = getattr(os, "O_DIRECT", 0)


def should_write_direct(size: int, enabled: bool = True) -> bool:
    """Whether a file of ``size`` bytes is written with ``O_DIRECT``: if ``enabled``,
    the platform has it, and the file has at least ``MIN_DIRECT_FILE_BYTES``."""
    return enabled and bool(_O_DIRECT) and size >= MIN_DIRECT_FILE_BYTES


def pwrite_direct(path: str, data: memoryview, offset: int) -> bool:
    """Write ``data`` at ``offset`` of the existing file ``path`` with ``O_DIRECT``,
    from ``data`` itself if it starts on a page, else through page-aligned bounce
    buffers, and return True; or return False where that cannot be done: an
    ``offset`` or length that is not a multiple of ``ALIGN``, a platform without
    ``O_DIRECT``, a filesystem that refuses it (``EINVAL``), a short write off a
    block boundary. The caller then writes all of ``data`` through the page cache;
    any part already written gets the same bytes again.

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
            refused(path, "the open")
            return False
        raise  # names the path
    try:
        source = np.frombuffer(view, np.uint8)
        # Memory starting on a page is written as it is; any other goes through a copy.
        aligned = source.ctypes.data % ALIGN == 0
        bounce = None if aligned else aligned_buffer(min(BOUNCE_BYTES, len(view)))
        done = 0
        while done < len(view):
            n = min(BOUNCE_BYTES, len(view) - done)
            piece = source[done : done + n]
            if bounce is not None:
                np.copyto(bounce[:n], piece)
                piece = bounce[:n]
            written = 0
            while written < n:
                step = os.pwrite(fd, piece[written:n], offset + done + written)
                if step <= 0 or step % ALIGN:  # not resumable with O_DIRECT
                    logger.debug("air-transfer: a short O_DIRECT write of %s: %d bytes", path, step)
                    return False
                written += step
            done += n
    except OSError as e:
        if e.errno == errno.EINVAL:
            refused(path, "a write")
            return False
        raise error_at(e, path, f"writing at offset {offset}") from e
    finally:
        os.close(fd)
    return True


def pread_direct(fd: int, offset: int, buffer: memoryview) -> int | None:
    """Fill ``buffer`` from ``offset`` of the file open as ``fd``, with ``O_DIRECT``
    (through a descriptor of its own for the same file, as ``pwrite_direct`` writes),
    until it is full or the file ends: how many bytes were read. None where that
    cannot be done (an offset, length or address off ``ALIGN``, a platform without
    ``O_DIRECT``, a filesystem that refuses it): the caller reads through the page
    cache. Why: measured on the storage node of a 2-rank incremental DCP save, the
    kernel's copy of stored chunks out of the page cache was most of its CPU (1.1 of
    1.2-1.4 s per save); read by the disk into the buffer, 0.3 s in all."""
    address = np.frombuffer(buffer, np.uint8).ctypes.data
    if not _O_DIRECT or offset % ALIGN or len(buffer) % ALIGN or address % ALIGN:
        return None
    proc = f"/proc/self/fd/{fd}"
    try:
        direct = os.open(proc, os.O_RDONLY | _O_DIRECT | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOENT):  # refused; no /proc
            logger.debug("air-transfer: no O_DIRECT read of %s: %s", proc, e)
            return None
        raise
    try:
        filled = 0
        while filled < len(buffer):
            n = os.preadv(direct, [buffer[filled:]], offset + filled)
            filled += n
            if n == 0 or n % ALIGN:  # the file ended (a short read ends off a block)
                break
        return filled
    except OSError as e:
        if e.errno == errno.EINVAL:  # the filesystem refused it: read through the cache
            logger.debug("air-transfer: no O_DIRECT read of %s: %s", proc, e)
            return None
        raise
    finally:
        os.close(direct)


def aligned_buffer(nbytes: int) -> np.ndarray:
    """``nbytes`` of private memory starting on an ``ALIGN`` boundary."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]


def enable_direct(fd: int) -> bool:
    if not _O_DIRECT:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | _O_DIRECT)
    except OSError as e:
        if e.errno == errno.EINVAL:
            refused(f"descriptor {fd}", "fcntl(O_DIRECT)")
            return False
        raise
    return True


_refusals_logged: set[str] = set()


def refused(where: str, what: str) -> None:
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


def disable_direct(fd: int) -> bool:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
    return False
