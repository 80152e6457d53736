"""Node storage, the storage-node side: where the checkpoints stored here hold which
chunks, so that a new one is told what need not travel.

A checkpoint stored as a tree is one entry; the files an upload stream commits
(torch DCP's shards) are grouped by the directory they were committed into, so a
save of many files still counts as one checkpoint. A hint, never a proof: a file
found here may have been deleted, replaced or corrupted since, so whoever reuses a
chunk reads and hashes it first (``storage.server.incremental``). Kept in the
agent's memory per storage root, for the last ``KEEP`` checkpoints stored there (a
new agent starts empty, and the next checkpoint is then sent whole). Plain Python.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

#: Checkpoints indexed per storage root; older ones are no longer offered as bases.
KEEP = 8

ChunkKey = tuple[str, int]  # (checksum, length)
FileKey = tuple[int, tuple[str, ...]]  # (size, checksums of its chunks)


@dataclass
class _Stored:
    """One stored checkpoint: where each of its chunks and whole files lie."""

    chunks: dict[ChunkKey, tuple[str, int]] = field(default_factory=dict)
    files: dict[FileKey, str] = field(default_factory=dict)
    group: str | None = None  # the directory of files committed one by one


class ChunkIndex:
    """The chunks and files of the checkpoints stored under each root, newest first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roots: dict[str, deque[_Stored]] = {}

    def add(
        self,
        root: str,
        files: Iterable[tuple[str, int, tuple[str, ...]]],
        chunk_bytes: int,
        group: str | None = None,
    ) -> None:
        """Note a checkpoint just stored under ``root``: ``(node path, size, chunk
        checksums)`` of each of its files; with ``group``, files added to the entry of
        that group (made if it has none yet, or none any more)."""
        stored = _Stored(group=group)
        for path, size, checksums in files:
            if not size:
                continue
            stored.files[(size, checksums)] = path
            for k, checksum in enumerate(checksums):
                offset = k * chunk_bytes
                stored.chunks[(checksum, min(chunk_bytes, size - offset))] = (path, offset)
        with self._lock:
            entries = self._roots.setdefault(root, deque(maxlen=KEEP))
            same = next((s for s in entries if group is not None and s.group == group), None)
            if same is None:
                entries.appendleft(stored)
            else:
                same.chunks.update(stored.chunks)
                same.files.update(stored.files)

    def files(self, root: str, size: int, checksums: tuple[str, ...]) -> Iterator[str]:
        """Stored files that held these bytes when stored, newest first."""
        key = (size, checksums)
        for stored in self._snapshot(root):
            path = stored.files.get(key)
            if path is not None:
                yield path

    def chunks(self, root: str, checksum: str, length: int) -> Iterator[tuple[str, int]]:
        """``(node path, offset)`` of stored chunks that had this checksum, newest first."""
        key = (checksum, length)
        for stored in self._snapshot(root):
            where = stored.chunks.get(key)
            if where is not None:
                yield where

    def _snapshot(self, root: str) -> list[_Stored]:
        with self._lock:
            return list(self._roots.get(root, ()))
