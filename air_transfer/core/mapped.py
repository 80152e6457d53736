"""Chunks handed out as read-only ``mmap`` views of their source file, under a read
lease, so that the object store's copy of a packed chunk is the only copy.

A truncate under a mapping makes the next access ``SIGBUS`` (a crash, not an
exception), so a file is mapped only while this process holds a read lease on it
(``fcntl F_SETLEASE F_RDLCK``): another process's ``open`` for writing or
``truncate`` then waits until the lease is released. The lease is also why the
checksum taken of the mapped bytes is the checksum of what the store receives: no
one can change the file while it is held, and it is held until the last view of the
mapping is gone (Ray has copied the task's return values). The kernel refuses the
lease when anyone has the file open for writing, to another user, or on a filesystem
without leases: ``lease`` then returns None and the caller reads the file instead.
Notes (the break signal, the kernel's lease-break timeout): ``docs/design.md``.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import signal
import threading
import weakref

import numpy as np

#: Kernel page size: mapping offsets must be multiples of it.
PAGE = mmap.ALLOCATIONGRANULARITY

# Linux lease break: the kernel signals the holder (SIGIO by default, which kills a
# process that does not handle it). A signal that is ignored by default is named for
# the descriptor before the lease exists, and the owner is cleared right after, so no
# signal is sent at all; the lease is released when the views are gone, not on the
# signal (the breaker waits at most that long).
_BREAK_SIGNAL = int(signal.SIGWINCH)


class Lease:
    """A read lease on one open source file (``fd``, owned by its caller), released
    by ``drop`` once every holder (the packing group, each view) has let go."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._holders = 1  # the packing group
        self._lock = threading.Lock()
        self.closed = False

    def view(self, offset: int, length: int) -> np.ndarray:
        """``length`` bytes of the file from ``offset``, mapped read-only; the lease is
        kept while the returned array (or any view of it) lives."""
        start = offset - offset % PAGE
        mapping = mmap.mmap(self.fd, offset + length - start, access=mmap.ACCESS_READ, offset=start)
        if hasattr(mmap, "MADV_SEQUENTIAL"):
            mapping.madvise(mmap.MADV_SEQUENTIAL)
        base = np.frombuffer(mapping, dtype=np.uint8)
        with self._lock:
            self._holders += 1
        weakref.finalize(base, self.drop)
        return base[offset - start :]

    def drop(self) -> None:
        """One holder lets go; the last one releases the lease and closes ``fd``."""
        with self._lock:
            self._holders -= 1
            if self._holders or self.closed:
                return
            self.closed = True
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        finally:
            os.close(self.fd)


def lease(fd: int) -> Lease | None:
    """A read lease on the file open (read-only) as ``fd``, on a duplicate of it that
    the lease then owns; None where the kernel refuses one (``EAGAIN``: someone has it
    open for writing; ``EACCES``: another user's file; ``EINVAL``: no leases on this
    filesystem) or the platform has none."""
    if not hasattr(fcntl, "F_SETLEASE"):
        return None
    own = os.dup(fd)
    try:
        fcntl.fcntl(own, fcntl.F_SETSIG, _BREAK_SIGNAL)
        fcntl.fcntl(own, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        os.close(own)
        return None
    fcntl.fcntl(own, fcntl.F_SETOWN, 0)
    return Lease(own)


def is_mapped(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a file mapping (a chunk packed without a copy)."""
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)
