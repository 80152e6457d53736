"""Node storage, the storage-node side: chunks read back from the files this node
stores, proven now: ``proven_chunk`` fills a chunk from the first stored copy whose
bytes there still have its checksum (read and hashed now: nothing is trusted from
the index), from files opened once per store, confined to the root
(``StoredFiles``), read around the page cache where they can be
(``read_around_cache``). What ``incremental`` and ``stream_uploads`` reuse.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable

from air_transfer.core.aligned_writes import pread_direct
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.confine import open_regular
from air_transfer.core.reuse import read_at


def proven_chunk(
    where: Iterable[tuple[str, int]],
    base: Callable[[str], int | None],
    view: memoryview,
    checksum: str,
    stats: Counter[str],
    read: Callable[[int, int, memoryview], bool] = read_at,
) -> bool:
    """Fill ``view`` from the first ``(stored file, offset)`` of ``where`` whose bytes
    there have ``checksum`` now (read with ``read``, and hashed); each one that no
    longer does is counted in ``stats`` as rejected."""
    for path, at in where:
        src = base(path)
        if src is None:
            continue
        if read(src, at, view) and chunk_checksum(view) == checksum:
            return True
        stats["chunks_rejected"] += 1
    return False


def read_around_cache(room: memoryview, fd: int, offset: int, view: memoryview) -> bool:
    """``read_at`` of ``view``, the start of ``room`` (page-aligned, whole blocks),
    read by the disk into ``room`` around the page cache where the file and the
    filesystem allow (``pread_direct``), else through it."""
    n = pread_direct(fd, offset, room)
    return read_at(fd, offset, view) if n is None else n >= len(view)


class StoredFiles:
    """Stored files opened (confined to ``root``) for one store, each once."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.fds: dict[str, int | None] = {}  # node path -> fd (None: unusable)

    def open(self, path: str) -> int | None:
        if path not in self.fds:
            try:
                self.fds[path] = open_regular(self.root, path)[0]
            except OSError:  # deleted, replaced by a directory, left the root: unusable
                self.fds[path] = None
        return self.fds[path]

    def close(self) -> None:
        for fd in self.fds.values():
            if fd is not None:
                os.close(fd)
        self.fds.clear()
