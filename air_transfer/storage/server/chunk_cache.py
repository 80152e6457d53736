"""Node storage, the storage-node side: a file's chunks served as shared objects.

Runs in the agent of the storage node (``NodeReads.file_chunks``). A reader on
another node asks for the refs of a range of a file's chunks; the agent packs the
ones it does not hold yet (the packing tasks of ``transfer.agent_tasks``, which it
submits to itself, so it owns them) and keeps their refs, keyed by the file's
version (device, inode, size, mtime: a stored file is never written in place),
while they fit the byte budget the readers ask for (``TransferConfig.cache_bytes``).
N readers of one checkpoint, at once or one after the other, then share the same
objects: the disk is read once, and Ray's object manager may serve a chunk from any
node already holding a copy.
An entry is dropped when the budget needs room (least recently used first) or when
nobody asked for it for ``KNOBS.read_cache_idle_s``; readers holding its ref keep
the object alive until they let go, as Ray does for any object.

Whole checkpoint directories are kept the same way, one transfer each
(``directory_transfers``), within the same cap.

Whatever the readers ask, what is kept is at most ``CACHE_SHARE`` of this node's
object store (``cache_cap``): the store also takes every chunk of the uploads in
flight to this node and of the reads being pulled from it, and a cache that fills
it makes Ray spill (write to disk, and read back) the very chunks it holds. Seen in
the DCP bench: a 1 GiB store, the default 1 GiB cache filled by restores, and the
next save spilled 965 MiB at ~380 MiB/s while it ran.

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

import pyarrow.fs as pafs

from air_transfer.cluster.refs import ChecksumRef, ChunkRef
from air_transfer.core.confine import at, oserror
from air_transfer.core.confined_dirs import ConfinedSource, lstat_resolved
from air_transfer.core.entry import Entry
from air_transfer.core.knobs import KNOBS
from air_transfer.core.placed_mark import is_stub, stub_refused
from air_transfer.core.plan import ChunkPlan, plan_chunks
from air_transfer.core.scan import Source, Stamp
from air_transfer.core.threads import Periodic
from air_transfer.errors import SourceChangedError

#: Submits packing tasks for ``plans`` of ``source``: (chunk refs, checksum refs).
Submit = Callable[[Source, Iterable[ChunkPlan]], tuple[list[ChunkRef], list[ChecksumRef]]]
#: What identifies one chunk of one version of a file.
Key = tuple[str, int, int, int, int, int, int]


#: The most of its node's object store the read caches keep (``cache_cap``).
CACHE_SHARE = 0.25


def cache_cap(store_bytes: int | None) -> int | None:
    """What the read caches of a node whose object store holds ``store_bytes`` keep
    at most (None: no cap, the store's size being unknown)."""
    return None if store_bytes is None else int(store_bytes * CACHE_SHARE)


def capped(budget: int, cap: int | None) -> int:
    """A reader's ``budget``, within the node's ``cache_cap``."""
    return budget if cap is None else min(budget, cap)


def reaper(name: str, expire_now: Callable[[], None]) -> Periodic:
    """Expires a cache's idle entries even when no reader asks any more: a thread
    named ``name``, started by the cache's first request, that calls ``expire_now``
    (the cache's, which takes its lock) every half ``KNOBS.read_cache_idle_s``, while
    the cache lives."""
    return Periodic(name, lambda: KNOBS.read_cache_idle_s / 2, expire_now)


@dataclass
class _Entry:
    chunk: ChunkRef
    checksum: ChecksumRef
    nbytes: int
    used: float  # time.monotonic() of the last request


class FileChunks:
    """The chunk objects of node-storage files, packed once and shared."""

    def __init__(self, submit: Submit, cap: int | None = None) -> None:
        self._submit = submit
        self._cap = cap  # ``cache_cap``: at most this many bytes kept, whatever asked
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._held = 0  # bytes of the entries
        self._counts = {"bytes_read": 0, "bytes_served": 0, "chunks_packed": 0, "hits": 0}
        self._reaper = reaper("air-transfer-read-cache", self._expire_now)

    def refs(
        self,
        root: str,
        path: str,
        size: int,
        chunk_bytes: int,
        first: int,
        count: int,
        budget: int,
    ) -> list[tuple[ChunkRef, ChecksumRef]]:
        """``(chunk ref, checksum ref)`` of chunks ``first``..``first + count - 1`` of
        the ``size``-byte file ``path`` (confined to ``root``), packing those not held.

        The file must still be ``size`` bytes (else SourceChangedError, ESTALE):
        a reader opened it at that size. Packing proves every byte against the file's
        stamp taken here, so a chunk is of this version or its checksum is an error.
        """
        st, real = at(root, path, lambda w: (lstat_resolved(w), w.real))
        if not stat.S_ISREG(st.st_mode):
            raise oserror(IsADirectoryError, errno.EISDIR, path, ": not a regular file")
        if is_stub(real):  # its bytes are on its holders: never the record and zeros
            raise stub_refused(path)
        if st.st_size != size:
            raise SourceChangedError(
                errno.ESTALE,
                f"changed while being read: {size} bytes when opened, {st.st_size} now",
                path,
            )
        stamp = Stamp.of_stat(st)
        # Not its ctime: a stored file is never written in place, and a link made
        # or dropped by another checkpoint changes its ctime, not its bytes.
        version = (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        last = -(-size // chunk_bytes)
        wanted = range(first, min(first + count, last))
        now = time.monotonic()
        with self._lock:
            self._reaper.start()
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
                self._evict(capped(budget, self._cap))
            served = [found[i] for i in wanted]
            self._counts["bytes_served"] += sum(e.nbytes for e in served)
            return [(e.chunk, e.checksum) for e in served]

    def counters(self) -> dict[str, int]:
        """Bytes read from disk and served, chunks packed, cache hits, bytes held."""
        with self._lock:
            return {**self._counts, "bytes_held": self._held}

    def clear(self) -> None:
        """Drop every entry (readers keep what they hold)."""
        with self._lock:
            self._entries.clear()
            self._held = 0

    def _evict(self, budget: int) -> None:
        while self._held > budget and self._entries:
            _, entry = self._entries.popitem(last=False)
            self._held -= entry.nbytes

    def _expire_now(self) -> None:
        with self._lock:
            self._expire(time.monotonic())

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
