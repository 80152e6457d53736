"""Node storage, the storage-node side: a checkpoint stored from what this node
already holds, and only the rest sent.

The sender sent ``ChunkedFiles`` (entries, a checksum per per-file chunk). Here,
into a staging directory next to the target:
- a file whose size and checksums are those of a file of an earlier checkpoint
  under the same storage root (``chunk_index``) is cloned from it (``FICLONE``,
  its own inode) where the filesystem can, else hard-linked when the modes agree:
  one copy on disk however many checkpoints hold it;
- every other chunk with a match is read from the stored file that had it and
  copied into the new file (no network);
- what is left is sent (``senders``): only those chunks travel.
Nothing is trusted from the index: every reused byte is read and hashed now,
before it counts (a clone or link is hashed whole), and a chunk whose stored copy
no longer matches (deleted, replaced, corrupted) is sent instead. The tree is then
published as the writer publishes (``core.publish``). A stored file is never
written again after publishing (every write of node storage replaces a file),
which is what makes sharing its inode safe; deleting any checkpoint only drops a
link. Plain Python but for the senders it is handed; each store counts in node
storage's upload metrics.

Upload streams (torch DCP's shards, ``stream_uploads``) reuse chunks one by one
through ``reuse_chunk``, proven the same way, and their files join the index once
committed (``note_file``), so streams and trees reuse each other's chunks.
"""

from __future__ import annotations

import errno
import functools
import os
import posixpath
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence

from air_transfer.core.aligned_writes import ALIGN, aligned_buffer
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.confine import open_regular, real_root
from air_transfer.core.confined_dirs import write_beneath
from air_transfer.core.entry import Entry
from air_transfer.core.file_chunks import ChunkedFiles
from air_transfer.core.plan import ChunkPlan
from air_transfer.core.publish import check_before_writing, publish
from air_transfer.core.reuse import clone_into, link_into, verified, write_at
from air_transfer.core.staging import Site
from air_transfer.errors import SourceChangedError
from air_transfer.observe.telemetry import NODE_STORAGE, Transfer, describe
from air_transfer.storage.server.chunk_index import ChunkIndex
from air_transfer.storage.server.stored_chunks import StoredFiles, proven_chunk, read_around_cache

#: What the storage node is told to fetch: the plans of the chunks it lacks.
Send = Callable[[Sequence[ChunkPlan]], Iterator[tuple[ChunkPlan, memoryview]]]
#: What a store did, in bytes and files (``STATS``); also summed per agent.
STATS = (
    "files",
    "files_cloned",
    "files_linked",
    "bytes_cloned",
    "bytes_linked",
    "chunks_reused",
    "bytes_reused",
    "chunks_sent",
    "bytes_sent",
    "bytes_written",
    "chunks_rejected",
)

_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class IncrementalStore:
    """Incremental stores into this node's storage, and what they reused."""

    def __init__(self) -> None:
        self._index = ChunkIndex()
        self._lock = threading.Lock()
        self._totals: Counter[str] = Counter()

    def totals(self) -> dict[str, int]:
        """Every ``STATS`` counter summed over this agent's stores."""
        with self._lock:
            return {name: self._totals[name] for name in STATS}

    def count(self, stats: Mapping[str, int]) -> None:
        """Add what an upload stream did to the totals."""
        with self._lock:
            self._totals.update(stats)

    def reuse_chunk(self, root: str, checksum: str, length: int) -> memoryview | None:
        """A chunk of ``checksum`` and ``length`` bytes that a file stored under
        ``root`` holds, read and proven now (counted as reused); None if none holds it
        now. Its buffer is made only once the index names a stored copy (a chunk
        never stored, as every chunk of a first save, costs a lookup), unzeroed (the
        read fills it, the checksum proves every byte: ``bytearray`` would zero 32 MiB
        first, ~12 ms) and page-aligned, so that the disk reads the chunk straight
        into it (``pread_direct``) and a direct write takes it as it is."""
        key, stats = real_root(root), Counter[str]()
        where = list(self._index.chunks(key, checksum, length))
        if not where:
            return None
        room = memoryview(aligned_buffer(-(-length // ALIGN) * ALIGN))  # whole blocks
        view, bases = room[:length], StoredFiles(key)
        read = functools.partial(read_around_cache, room)
        try:
            found = proven_chunk(where, bases.open, view, checksum, stats, read)
        finally:
            bases.close()
        if found:
            stats.update(chunks_reused=1, bytes_reused=length)
        self.count(stats)
        return view if found else None

    def proven_file(
        self, root: str, size: int, sums: tuple[str, ...], chunk_bytes: int
    ) -> int | None:
        """An open descriptor (the caller closes it) of a file stored under ``root``
        holding exactly these bytes, read and proven now; None if none does now. Its
        read buffer is made only once the index names a candidate (as ``reuse_chunk``'s)."""
        key = real_root(root)
        paths = list(self._index.files(key, size, sums))
        if not paths:
            return None
        buffer = memoryview(aligned_buffer(chunk_bytes))  # filled by each read
        for path in paths:
            try:
                fd = open_regular(key, path)[0]
            except OSError:  # deleted, replaced by a directory, left the root
                continue
            if verified(fd, size, chunk_bytes, sums, buffer):
                return fd
            os.close(fd)
            self.count({"chunks_rejected": 1})
        return None

    def note_file(
        self, root: str, path: str, size: int, sums: tuple[str, ...], chunk_bytes: int
    ) -> None:
        """Offer the file just committed at node path ``path`` (its real path) to later
        stores, with the checkpoint of its directory."""
        group = posixpath.dirname(path)
        self._index.add(real_root(root), [(path, size, sums)], chunk_bytes, group)

    def store(
        self,
        root: str,
        path: str,
        files: ChunkedFiles,
        send: Send,
        check: Callable[[], None] | None = None,
    ) -> dict[str, int]:
        """Store ``files``' checkpoint at ``path`` (confined to ``root``), reusing what
        earlier checkpoints under ``root`` hold and having ``send`` bring the rest;
        returns what it cost (``STATS``). ``check`` is called before each file and
        each chunk sent; what it raises ends the store, nothing published."""
        key = real_root(root)
        assembly = _Assembly(key, files, self._index, check or (lambda: None))
        # Counted as node storage's uploads are (no bar: it would run in the agent).
        transfer = Transfer(
            "upload", strategy=NODE_STORAGE, total=files.manifest.total_bytes,
            desc=describe(path, "store"), progress=False,
        ).start()  # fmt: skip
        try:
            stored = write_beneath(root, path, lambda target: assembly.write(target, send))
        except BaseException as e:
            transfer.finish(e)
            raise
        transfer.advance(assembly.stats["bytes_written"])
        transfer.finish()
        self._index.add(
            key,
            ((f"{stored}/{f.path}", f.size, sums) for f, _, sums in files.files()),
            files.chunk_bytes,
        )
        with self._lock:
            self._totals.update(assembly.stats)
        return {name: assembly.stats[name] for name in STATS}


class _Assembly:
    """One store: the staging tree filled from local copies, then from the sender."""

    def __init__(
        self, root: str, files: ChunkedFiles, index: ChunkIndex, check: Callable[[], None]
    ) -> None:
        self.root, self.files, self.index, self.check = root, files, index, check
        self.stats: Counter[str] = Counter()
        self.buffer = memoryview(aligned_buffer(files.chunk_bytes))  # filled by each read
        self.bases = StoredFiles(root)
        self.own: list[Entry] = []  # files with an inode of their own: mode and mtime set

    def write(self, target: str, send: Send) -> None:
        parent, name = os.path.split(target)
        site = Site(parent, name)
        site.clean_up()
        manifest = self.files.manifest
        check_before_writing(manifest, site, target)
        with site.staging() as staging:
            try:
                missing = self._fill(staging.path)
            finally:
                self.bases.close()
            self._receive(staging.path, missing, send)
            self._finish(staging.path)
            with site.publish_lock():
                site.recover_locked()
                publish(manifest, staging, target)

    # -- what this node holds --------------------------------------------------------
    def _fill(self, top: str) -> list[ChunkPlan]:
        """Make the tree and every file from local copies; the plans still missing."""
        manifest, cb = self.files.manifest, self.files.chunk_bytes
        for e in manifest.entries:
            if e.kind == "dir":
                os.mkdir(f"{top}/{e.path}", 0o700)
        plans = self.files.plans()
        missing: list[ChunkPlan] = []
        for f, first, sums in self.files.files():
            self.check()
            self.stats["files"] += 1
            dst = f"{top}/{f.path}"
            how = self._whole(f, sums, dst) if f.size else None
            if how == "link":
                continue
            self.own.append(f)
            if how == "clone":
                continue
            fd = os.open(dst, _NEW, 0o600)
            try:
                os.ftruncate(fd, f.size)
                for k, checksum in enumerate(sums):
                    length = min(cb, f.size - k * cb)
                    if not self._reuse_chunk(fd, k * cb, length, checksum):
                        missing.append(plans[first + k])
            finally:
                os.close(fd)
        return missing

    def _whole(self, f: Entry, sums: tuple[str, ...], dst: str) -> str | None:
        """Bring in a stored file holding exactly ``f``'s bytes, proven: "clone",
        "link", or None (none found, or only one whose mode differs and cannot be
        cloned: its chunks are copied instead)."""
        cb = self.files.chunk_bytes
        for path in self.index.files(self.root, f.size, sums):
            src = self.bases.open(path)
            if src is None:
                continue
            out = os.open(dst, _NEW, 0o600)
            try:
                cloned = clone_into(src, out)
                good = verified(out if cloned else src, f.size, cb, sums, self.buffer)
            finally:
                os.close(out)
            if cloned and good:
                self._count("files_cloned", "bytes_cloned", f.size)
                return "clone"
            os.unlink(dst)
            if not good:
                # Corrupted or replaced: the next one, or its good chunks one by one.
                self.stats["chunks_rejected"] += 1
                continue
            if stat.S_IMODE(os.fstat(src).st_mode) != f.mode:
                return None
            if link_into(src, dst):
                self._count("files_linked", "bytes_linked", f.size)
                return "link"
            return None
        return None

    def _reuse_chunk(self, out: int, offset: int, length: int, checksum: str) -> bool:
        """Copy a stored chunk with ``checksum`` to ``offset`` of ``out``, once read
        and proven; False if no stored copy has it now."""
        view = self.buffer[:length]
        where = self.index.chunks(self.root, checksum, length)
        if not proven_chunk(where, self.bases.open, view, checksum, self.stats):
            return False
        write_at(out, offset, view)
        self._count("chunks_reused", "bytes_reused", length)
        self.stats["bytes_written"] += length
        return True

    # -- what the sender sends -------------------------------------------------------
    def _receive(self, top: str, missing: list[ChunkPlan], send: Send) -> None:
        """Write the chunks the sender sends, each checked against the checksum the
        sender announced (its file changed since: SourceChangedError)."""
        sums = self.files.checksums
        for plan, view in send(missing):
            self.check()
            (path, _), span = plan.files[0], plan.spans[0]
            if len(view) != plan.length or chunk_checksum(view) != sums[plan.index]:
                raise SourceChangedError(
                    errno.EAGAIN,
                    f"{path!r} changed since its checksums were taken (its bytes at offset "
                    f"{span.file_offset} differ); nothing was published: report again",
                    path,
                )
            fd = os.open(f"{top}/{path}", os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                write_at(fd, span.file_offset, view)
            finally:
                os.close(fd)
            self._count("chunks_sent", "bytes_sent", plan.length)
            self.stats["bytes_written"] += plan.length

    def _finish(self, top: str) -> None:
        """Modes and mtimes of the files with an inode of their own (a hard link
        keeps its first copy's), and the symlinks."""
        for f in self.own:
            os.chmod(f"{top}/{f.path}", f.mode)
            os.utime(f"{top}/{f.path}", ns=(f.mtime_ns, f.mtime_ns))
        for e in self.files.manifest.entries:
            if e.kind == "symlink":
                where = f"{top}/{e.path}"
                os.symlink(e.target or "", where)
                os.utime(where, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)

    def _count(self, things: str, nbytes: str, size: int) -> None:
        self.stats[things] += 1
        self.stats[nbytes] += size
