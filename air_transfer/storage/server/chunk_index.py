"""Node storage, the storage-node side: where the checkpoints stored here hold which
chunks, so that a new one is told what need not travel.

A checkpoint stored as a tree is one entry; the files an upload stream commits
(torch DCP's shards, writer-placed blobs) are grouped by the directory they were
committed into, so a save of many files still counts as one checkpoint; a group
written to again is the newest, and sheds its oldest files past ``GROUP_CHUNKS``.
A hint, never a proof: a file found here may have been deleted, replaced or
corrupted since, so whoever reuses a chunk reads and hashes it first
(``storage.server.incremental``). Kept in the agent's memory per storage root, for
the last ``KEEP`` checkpoints stored there (a new agent starts empty, and the next
checkpoint is then sent whole). Plain Python.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

#: Checkpoints indexed per storage root; older ones are no longer offered as bases.
KEEP = 8
#: The most chunks one group's entry offers: its oldest files go first beyond it.
#: A writer-placed storage's blobs, committed one by one into one directory per
#: storage on each holder, are one group that would otherwise only grow (2 TiB
#: of 32 MiB chunks; a DCP checkpoint's directory never comes near it).
GROUP_CHUNKS = 1 << 16

ChunkKey = tuple[str, int]  # (checksum, length)
FileKey = tuple[int, tuple[str, ...]]  # (size, checksums of its chunks)


@dataclass
class _Stored:
    """One stored checkpoint: where each of its chunks and whole files lie."""

    chunks: dict[ChunkKey, tuple[str, int]] = field(default_factory=dict)
    files: dict[FileKey, str] = field(default_factory=dict)
    group: str | None = None  # the directory of files committed one by one
    added: dict[str, tuple[FileKey, list[ChunkKey]]] = field(default_factory=dict)  # in order

    def merge(self, newer: _Stored) -> None:
        """Take ``newer``'s files (the newest copy of a chunk wins), then drop the
        oldest files while more than ``GROUP_CHUNKS`` chunks are offered."""
        for path in newer.added:  # a path stored again: its earlier bytes are gone
            self._drop(path)
        self.chunks.update(newer.chunks)
        self.files.update(newer.files)
        self.added.update(newer.added)
        while len(self.chunks) > GROUP_CHUNKS and len(self.added) > 1:
            self._drop(next(iter(self.added)))

    def _drop(self, path: str) -> None:
        """No longer offer ``path`` (its chunks that a newer file took stay that one's)."""
        if path not in self.added:
            return
        file_key, chunk_keys = self.added.pop(path)
        for key in chunk_keys:
            if self.chunks.get(key, ("", 0))[0] == path:
                del self.chunks[key]
        if self.files.get(file_key) == path:
            del self.files[file_key]


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
            keys = [
                (checksum, min(chunk_bytes, size - k * chunk_bytes))
                for k, checksum in enumerate(checksums)
            ]
            for k, key in enumerate(keys):
                stored.chunks[key] = (path, k * chunk_bytes)
            stored.added[path] = ((size, checksums), keys)
        with self._lock:
            entries = self._roots.setdefault(root, deque(maxlen=KEEP))
            same = next((s for s in entries if group is not None and s.group == group), None)
            if same is None:
                entries.appendleft(stored)
            else:  # the group goes on: newest again, not the next to be forgotten
                entries.remove(same)
                entries.appendleft(same)
                same.merge(stored)

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
