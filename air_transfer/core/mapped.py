"""Chunks handed out as read-only ``mmap`` views of their source file, under a read
lease, so that the object store's copy of a packed chunk is the only copy.

A truncate under a mapping makes the next access ``SIGBUS`` (a crash, not an
exception), so a file is mapped only while this process holds a read lease on it
(``fcntl F_SETLEASE F_RDLCK``): another process's ``open`` for writing or
``truncate`` then waits for the lease. The lease is also why the checksum taken of
the mapped bytes is the checksum of what the store receives: no one can change the
file while it is held. It is held until the last view of the mapping is gone (Ray
has copied the task's return values), or until another process wants the file:
the kernel then starts breaking it, and the watcher thread (``core.lease_breaks``)
puts a private copy of the file's bytes in place of every live mapping
(``core.mapping_copy``) and hands the lease back at once. The writer waits only
for that copy, and nothing reads the file through a mapping once it may change,
however long the packing thread stalls. The kernel refuses the lease when anyone
has the file open for writing, to another user, or on a filesystem without leases:
``lease`` then returns None and the caller reads the file instead. Notes:
``docs/design.md``, "Mapped chunks".
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from air_transfer.core import lease_breaks
from air_transfer.core.mapping_copy import replace_with_copy

#: Kernel page size: mapping offsets must be multiples of it.
PAGE = mmap.ALLOCATIONGRANULARITY

logger = logging.getLogger(__name__)


class _Mapping(NamedTuple):
    """A live mapping of the leased file: its ``mmap`` (kept so that its address is
    not unmapped while the watcher replaces it), address, length and file offset."""

    mapping: mmap.mmap
    address: int
    length: int
    offset: int


class FileReadLease:
    """A kernel read lease (``F_SETLEASE``) on one open source file (``fd``, owned by
    the lease), released by ``drop`` once every holder (the packing group, each
    view) has let go, or handed back early on a break (``hand_back_if_broken``).
    ``check`` raises SourceChangedError unless an ``os.stat_result`` is of the file as scanned."""

    def __init__(self, fd: int, check: Callable[[os.stat_result], None]) -> None:
        self.fd = fd
        self._check = check
        self._holders = 1  # the packing group
        # Reentrant: a view's finalizer may run (garbage collection) in a thread
        # that holds the lock already.
        self._lock = threading.RLock()
        self._mappings: dict[int, _Mapping] = {}
        self._keys = itertools.count()
        self.closed = False
        #: The file as it was once the views' private copies were read (handed back).
        self._copied: os.stat_result | None = None

    @property
    def handed_back(self) -> bool:
        """Whether the lease was handed back on a break (its views are copies)."""
        return self._copied is not None

    def view(self, offset: int, length: int) -> np.ndarray | None:
        """``length`` bytes of the file from ``offset``, mapped read-only; the lease is
        kept while the returned array (or any view of it) lives. None once the lease
        was handed back: the caller reads the file instead."""
        start = offset - offset % PAGE
        with self._lock:
            if self.closed or self.handed_back:
                return None
            mapping = mmap.mmap(
                self.fd, offset + length - start, access=mmap.ACCESS_READ, offset=start
            )
            if hasattr(mmap, "MADV_SEQUENTIAL"):
                mapping.madvise(mmap.MADV_SEQUENTIAL)
            base = np.frombuffer(mapping, dtype=np.uint8)
            key = next(self._keys)
            self._mappings[key] = _Mapping(mapping, base.ctypes.data, len(mapping), start)
            self._holders += 1
        weakref.finalize(base, self._unmapped, key)
        return base[offset - start :]

    def prove(self, check_file: Callable[[], None]) -> None:
        """Once the bytes of a view were used (hashed, stored): raise
        SourceChangedError unless they are the version scanned. While the lease is
        held, ``check_file`` says so (nobody could write the file meanwhile); once it
        was handed back, the stamps taken right after the views' copies were read."""
        with self._lock:
            copied = self._copied
            if copied is None:
                check_file()
                return
        self._check(copied)

    def hand_back_if_broken(self) -> None:
        """If the kernel is breaking the lease (``F_GETLEASE`` no longer ``F_RDLCK``):
        replace every live view's mapping by a private copy of its bytes, then
        release the lease. Run by the watcher thread; a failure keeps the lease (and
        the mappings not yet replaced) to be tried again on its next round."""
        with self._lock:
            if self.closed or self.handed_back:
                return
            if fcntl.fcntl(self.fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK:
                return
            self._holders += 1  # a finalizer run meanwhile must not close ``fd``
            try:
                for key, held in list(self._mappings.items()):
                    replace_with_copy(held.address, held.length, self.fd, held.offset)
                    del self._mappings[key]
                self._copied = copied = os.fstat(self.fd)
                # OSError: revoked already (the kernel did not wait for us).
                with contextlib.suppress(OSError):
                    fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            finally:
                self.drop()
        try:
            self._check(copied)
        except OSError as e:
            # Only if the kernel revoked the lease first (the whole process stalled
            # past lease-break-time): ``prove`` fails the chunks that check after.
            logger.warning("air-transfer: a leased file changed before its copy: %s", e)

    def _unmapped(self, key: int) -> None:
        with self._lock:
            self._mappings.pop(key, None)
        self.drop()

    def drop(self) -> None:
        """One holder lets go; the last one releases the lease and closes ``fd``."""
        with self._lock:
            self._holders -= 1
            if self._holders or self.closed:
                return
            self.closed = True
            try:
                if not self.handed_back:
                    fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            finally:
                os.close(self.fd)
        lease_breaks.forget(self)


def lease(fd: int, check: Callable[[os.stat_result], None]) -> FileReadLease | None:
    """A read lease on the file open (read-only) as ``fd``, on a duplicate of it that
    the lease then owns, watched for breaks (``core.lease_breaks``); ``check`` as
    for ``FileReadLease``. None where the kernel refuses one (``EAGAIN``: someone has it
    open for writing; ``EACCES``: another user's file; ``EINVAL``: no leases on this
    filesystem), the platform has none, or no watcher thread can run."""
    if not hasattr(fcntl, "F_SETLEASE") or not lease_breaks.ready():
        return None
    own = os.dup(fd)
    try:
        fcntl.fcntl(own, fcntl.F_SETSIG, lease_breaks.BREAK_SIGNAL)
        fcntl.fcntl(own, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        os.close(own)
        return None
    held = FileReadLease(own, check)
    lease_breaks.watch(held, own)
    return held


def is_mapped(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a file mapping (a chunk packed without a copy;
    its pages may since be a private copy, if its lease was handed back)."""
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)
