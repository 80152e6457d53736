"""Node storage, the storage-node side: file bodies read out in chunks.

Runs in the agent of the storage node (``NodeReads.disk_read``, a streaming
generator): the file is opened once, confined to the storage root (``confine.at``),
and its chunks are read from that open file into one reused buffer (Ray copies each
yielded chunk into the object store before the generator resumes).

A read sees one version of the file or fails: the size must be the one the caller
was told when it opened the file, and neither size nor mtime may change while the
chunks are read; otherwise SourceChangedError names the file. Plain Python.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator

import numpy as np

from air_transfer.core.confine import at, open_regular
from air_transfer.core.placed_mark import is_stub
from air_transfer.errors import SourceChangedError


def read_stored_chunks(
    root: str, path: str, size: int, chunk_bytes: int, first: int
) -> Iterator[np.ndarray]:
    """Chunks ``first``.. of the ``size``-byte file ``path`` under ``root``."""
    fd, before = open_regular(root, path)
    try:
        if before.st_size != size:
            raise _changed(path, f"{size} bytes when opened, {before.st_size} now")
        buffer = np.empty(min(chunk_bytes, size), dtype=np.uint8)
        with open(fd, "rb", buffering=0, closefd=False) as f:
            for offset in range(first * chunk_bytes, size, chunk_bytes):
                view = memoryview(buffer)[: min(chunk_bytes, size - offset)]
                f.seek(offset)
                done = 0
                while done < len(view):
                    got = f.readinto(view[done:])
                    if not got:
                        raise _changed(path, f"ends at byte {offset + done} of {size}")
                    done += got
                now = os.fstat(fd)
                if (now.st_size, now.st_mtime_ns) != (size, before.st_mtime_ns):
                    raise _changed(path, "written to while being read")
                yield buffer[: len(view)]
    finally:
        os.close(fd)


def _changed(path: str, how: str) -> SourceChangedError:
    return SourceChangedError(errno.ESTALE, f"changed while being read: {how}", path)


def read_stub_head(root: str, path: str, nbytes: int) -> tuple[int, bytes] | None:
    """``(size, first nbytes)`` of ``path`` under ``root`` if it is a placed file's
    stub (``core.placed_mark``); None for another file or a directory."""
    try:
        fd, st = open_regular(root, path, stubs_ok=True)
    except IsADirectoryError:
        return None
    try:
        return (st.st_size, os.pread(fd, nbytes, 0)) if is_stub(fd) else None
    finally:
        os.close(fd)


def stub_heads_under(root: str, path: str, nbytes: int) -> list[tuple[str, int, bytes]]:
    """``(path, size, first nbytes)`` of every placed file's stub at or under the
    directory ``path`` (confined to ``root``; links not followed)."""
    top = at(root, path, lambda w: w.real)
    found = []
    for base, _, files in os.walk(top):
        for name in files:
            where = os.path.join(base, name)
            try:
                fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError:  # a link, or gone meanwhile
                continue
            try:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode) and is_stub(fd):
                    found.append((where, st.st_size, os.pread(fd, nbytes, 0)))
            finally:
                os.close(fd)
    return found
