"""Bytes a storage node already holds, brought into a new file without the network:
a whole file cloned (``FICLONE``: a reflink, its own inode sharing the extents,
where the filesystem has it: btrfs, XFS, bcachefs, ...) or hard-linked (one inode,
ext4), and chunks read back to be proven and copied. Nothing here trusts a file to
hold what an index said: callers hash every byte they reuse (``verified``).
Linux (``/proc/self/fd``, ``FICLONE``). Plain Python.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Sequence

from air_transfer.core.checksum import chunk_checksum

#: ``_IOW(0x94, 9, int)``: make the destination share the source's extents.
FICLONE = 0x40049409
#: ``FICLONE`` errors meaning "not on this filesystem" (or not between these files).
_CLONE_REFUSED = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.EPERM}
)
#: ``link`` errors meaning "not here": no hard links on this filesystem, a file at
#: its link limit, ``protected_hardlinks``.
_LINK_REFUSED = frozenset(
    {errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOENT}
)


def clone_into(src_fd: int, dst_fd: int) -> bool:
    """Make the empty file ``dst_fd`` a reflink of ``src_fd``; False where the
    filesystem cannot (then ``dst_fd`` is still empty)."""
    try:
        fcntl.ioctl(dst_fd, FICLONE, src_fd)
    except OSError as e:
        if e.errno in _CLONE_REFUSED:
            return False
        raise
    return True


def link_into(src_fd: int, dst: str) -> bool:
    """Hard-link the open file ``src_fd`` as ``dst`` (``link_at`` in its directory);
    False where the filesystem refuses."""
    parent = os.open(os.path.dirname(dst) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return link_at(src_fd, parent, os.path.basename(dst))
    finally:
        os.close(parent)


def link_at(src_fd: int, dir_fd: int, name: str) -> bool:
    """Hard-link the open file ``src_fd`` as ``name`` in the directory ``dir_fd`` (by
    its descriptor, never by a path that could be swapped meanwhile); False where
    the filesystem refuses, or the file was deleted since it was opened (ENOENT: a
    file with no name left cannot be given one).

    ``linkat`` with ``AT_SYMLINK_FOLLOW`` on the fd's ``/proc`` link: plain ``link``
    (what ``os.link`` calls without a ``dir_fd``) would link the magic link itself
    and fail with EXDEV."""
    try:
        os.link(f"/proc/self/fd/{src_fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
    except OSError as e:
        if e.errno in _LINK_REFUSED:
            return False
        raise
    return True


def read_at(fd: int, offset: int, view: memoryview) -> bool:
    """Fill ``view`` from ``fd`` at ``offset``; False if the file ends first."""
    filled = 0
    while filled < len(view):
        n = os.preadv(fd, [view[filled:]], offset + filled)
        if not n:
            return False
        filled += n
    return True


def verified(
    fd: int, size: int, chunk_bytes: int, checksums: Sequence[str], buffer: memoryview
) -> bool:
    """Whether the file ``fd`` holds exactly ``size`` bytes whose per-file chunks
    have ``checksums`` (read now, through ``buffer`` of at least ``chunk_bytes``)."""
    if os.fstat(fd).st_size != size:
        return False
    for k, expected in enumerate(checksums):
        offset = k * chunk_bytes
        view = buffer[: min(chunk_bytes, size - offset)]
        if not read_at(fd, offset, view) or chunk_checksum(view) != expected:
            return False
    return True


def write_at(fd: int, offset: int, view: memoryview) -> None:
    """Write all of ``view`` at ``offset`` of ``fd``."""
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
