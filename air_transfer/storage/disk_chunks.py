"""Node storage, the storage-node side: a file's chunks served as shared objects.

Runs in the agent of the storage node (``NodeAgent.file_chunks``). A reader on
another node asks for the refs of a range of a file's chunks; the agent packs the
ones it does not hold yet (the packing tasks of ``strategies.agent_tasks``, which it
submits to itself, so it owns them) and keeps their refs, keyed by the file's
version (device, inode, size, mtime, ctime), while they fit the byte budget the
readers ask for (``TransferConfig.cache_bytes``). N readers of one checkpoint, at
once or one after the other, then share the same objects: the disk is read once,
and Ray's object manager may serve a chunk from any node already holding a copy.
An entry is dropped when the budget needs room (least recently used first) or when
nobody asked for it for ``KNOBS.read_cache_idle_s``; readers holding its ref keep
the object alive until they let go, as Ray does for any object.

The counters (``counters()``) say how many bytes were read from disk and served, so
tests and the bench can check "read once".
"""

from __future__ import annotations

import errno
import posixpath
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from air_transfer.config import TransferConfig
from air_transfer.errors import SourceChangedError
from air_transfer.knobs import KNOBS
from air_transfer.layout import Source, Stamp, scan
from air_transfer.manifest import Entry
from air_transfer.packing import ChunkPlan, plan_chunks
from air_transfer.storage.confine import Where, at, oserror
from air_transfer.storage.confined import ConfinedSource, lstat_resolved

#: Submits packing tasks for ``plans`` of ``source``: (chunk refs, checksum refs).
Submit = Callable[[Source, Iterable[ChunkPlan]], tuple[list[Any], list[Any]]]
#: What identifies one chunk of one version of a file.
Key = tuple[str, int, int, int, int, int, int, int]


@dataclass
class _Entry:
    chunk: Any  # ObjectRef of the chunk
    checksum: Any  # ObjectRef of its checksum
    nbytes: int
    used: float  # time.monotonic() of the last request


class FileChunks:
    """The chunk objects of node-storage files, packed once and shared."""

    def __init__(self, submit: Submit) -> None:
        self._submit = submit
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._held = 0  # bytes of the entries
        self._counts = {"bytes_read": 0, "bytes_served": 0, "chunks_packed": 0, "hits": 0}
        self._reaper: threading.Thread | None = None

    def refs(
        self,
        root: str,
        path: str,
        size: int,
        chunk_bytes: int,
        first: int,
        count: int,
        budget: int,
    ) -> list[tuple[Any, Any]]:
        """``(chunk ref, checksum ref)`` of chunks ``first``..``first + count - 1`` of
        the ``size``-byte file ``path`` (confined to ``root``), packing those not held.

        The file must still be ``size`` bytes (else SourceChangedError, ESTALE):
        a reader opened it at that size. Packing proves every byte against the file's
        stamp taken here, so a chunk is of this version or its checksum is an error.
        """
        st, real = at(root, path, lambda w: (lstat_resolved(w), w.real))
        if not stat.S_ISREG(st.st_mode):
            raise oserror(IsADirectoryError, errno.EISDIR, path, ": not a regular file")
        if st.st_size != size:
            raise SourceChangedError(
                errno.ESTALE,
                f"changed while being read: {size} bytes when opened, {st.st_size} now",
                path,
            )
        stamp = Stamp.of_stat(st)
        version = (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        last = -(-size // chunk_bytes)
        wanted = range(first, min(first + count, last))
        now = time.monotonic()
        with self._lock:
            self._start_reaper()
            self._expire(now)
            found: dict[int, _Entry] = {}
            for index in wanted:
                entry = self._entries.get((*version, chunk_bytes, index))
                if entry is not None:
                    self._entries.move_to_end((*version, chunk_bytes, index))
                    entry.used = now
                    found[index] = entry
            self._counts["hits"] += len(found)
            missing = [i for i in wanted if i not in found]
            if missing:
                parent, name = posixpath.split(real)
                # Read confined too: by this path again, and proven to be this inode.
                source = ConfinedSource(pafs.LocalFileSystem(), parent, storage_root=root)
                plans = _plans(name, size, stamp, chunk_bytes, missing)
                chunks, checksums = self._submit(source, plans)
                for index, plan, chunk, checksum in zip(
                    missing, plans, chunks, checksums, strict=True
                ):
                    entry = _Entry(chunk, checksum, plan.length, now)
                    found[index] = entry
                    self._entries[(*version, chunk_bytes, index)] = entry
                    self._held += plan.length
                    self._counts["bytes_read"] += plan.length
                    self._counts["chunks_packed"] += 1
                self._evict(budget)
            served = [found[i] for i in wanted]
            self._counts["bytes_served"] += sum(e.nbytes for e in served)
            return [(e.chunk, e.checksum) for e in served]

    def counters(self) -> dict[str, int]:
        """Bytes read from disk and served, chunks packed, cache hits, bytes held."""
        with self._lock:
            return {**self._counts, "bytes_held": self._held}

    def _start_reaper(self) -> None:
        """Expire idle entries even when no reader asks any more (a daemon thread)."""
        if self._reaper is None:
            self._reaper = threading.Thread(
                target=self._reap, name="air-transfer-read-cache", daemon=True
            )
            self._reaper.start()

    def _reap(self) -> None:
        while True:
            time.sleep(KNOBS.read_cache_idle_s / 2)
            with self._lock:
                self._expire(time.monotonic())

    def clear(self) -> None:
        """Drop every entry (readers keep what they hold)."""
        with self._lock:
            self._entries.clear()
            self._held = 0

    def _evict(self, budget: int) -> None:
        while self._held > budget and self._entries:
            _, entry = self._entries.popitem(last=False)
            self._held -= entry.nbytes

    def _expire(self, now: float) -> None:
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.used < KNOBS.read_cache_idle_s:
                return
            del self._entries[key]
            self._held -= entry.nbytes


def _plans(
    name: str, size: int, stamp: Stamp, chunk_bytes: int, indices: Sequence[int]
) -> list[ChunkPlan]:
    """The plans of chunks ``indices`` (ascending) of the one file ``name``."""
    entry = Entry(name, "file", size)
    plans = plan_chunks([entry], [stamp], chunk_bytes, indices[0], indices[-1] + 1)
    keep = set(indices)
    return [plan for plan in plans if plan.index in keep]


#: Starts a transfer of a directory owned by the agent: (checkpoint ref, completion).
StartTransfer = Callable[[Source, TransferConfig], tuple[Any, Any]]


class DirectoryTransfers:
    """Whole checkpoint directories of node storage, each version packed once as a
    transfer the agent owns and shared by every reader that asks for it while it is
    held: the same budget and idleness rules as ``FileChunks``. Ray Train's restores
    on other nodes ask for these (``train``), so N workers restoring one checkpoint
    read it from the storage node's disk once."""

    def __init__(self, start: StartTransfer) -> None:
        self._start = start
        self._lock = threading.Lock()
        self._held: OrderedDict[Any, tuple[Any, int, float]] = OrderedDict()
        self._bytes = 0
        self.started = 0  # transfers packed (tests, the bench)
        self.bytes_read = 0  # file bytes of the transfers packed: each read once
        self.bytes_served = 0  # file bytes of every transfer handed to a reader
        self._reaper: threading.Thread | None = None

    def ref(self, root: str, path: str, config: TransferConfig) -> Any:
        """The ref of a transferred checkpoint of directory ``path`` (confined to
        ``root``) as it is now."""
        real = at(root, path, lambda w: _directory(w, path))
        # Scanned and packed confined (``storage.confined``), not by this path again.
        source = ConfinedSource(pafs.LocalFileSystem(), real, storage_root=root)
        scanned = scan(source, config.follow_symlinks)
        key = (real, config, scanned.entries, scanned.stamps)
        now = time.monotonic()
        with self._lock:
            if self._reaper is None:  # expire idle transfers when nobody asks either
                self._reaper = threading.Thread(
                    target=self._reap, name="air-transfer-transfer-cache", daemon=True
                )
                self._reaper.start()
            self._expire(now)
            held = self._held.get(key)
            if held is not None:
                self._held.move_to_end(key)
                self._held[key] = (held[0], held[1], now)
                self.bytes_served += held[1]
                return held[0]
            ref, _ = self._start(source, config)
            size = sum(f.size for f in scanned.files)
            self.started += 1
            self.bytes_read += size
            self.bytes_served += size
            self._held[key] = (ref, size, now)
            self._bytes += size
            while self._bytes > config.cache_bytes and self._held:
                _, (_, dropped, _) = self._held.popitem(last=False)
                self._bytes -= dropped
            return ref

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._bytes = 0

    def _reap(self) -> None:
        while True:
            time.sleep(KNOBS.read_cache_idle_s / 2)
            with self._lock:
                self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        for key, (_, size, used) in list(self._held.items()):
            if now - used >= KNOBS.read_cache_idle_s:
                del self._held[key]
                self._bytes -= size


def _directory(w: Where, path: str) -> str:
    if not stat.S_ISDIR(lstat_resolved(w).st_mode):
        raise oserror(NotADirectoryError, errno.ENOTDIR, path, ": not a checkpoint directory")
    return w.real
