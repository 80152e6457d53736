"""Node storage, the storage-node side: incremental upload streams (a torch DCP
shard written through ``open_output_stream`` of an incremental node storage).

The writer cuts its bytes into per-file chunks (``core.file_chunks``), puts each full
chunk in its own node's object store and asks here with the chunk's checksum and a
ref to it: a chunk some file stored under the same root holds (``chunk_index``,
read and hashed now: ``IncrementalStore.reuse_chunk``) is copied into the staging
file from this disk, and only a chunk this node lacks (or whose stored copy no
longer matches) is fetched through the ref, so only those bytes cross the network.
Either way the staging file gets the chunk checked against its checksum: a fetched
one by ``DiskUploads.fs_write``, a stored copy by its proof (hashed once, not
again). At the commit, a stream whose every byte a stored file holds (proven: read
and hashed now) becomes a hard link of that file, one copy on disk for both; the
commit publishes the file whole as every upload's commit does, then offers it, with
its chunks' checksums, to later stores. Counted in ``IncrementalStore``'s totals
(``incremental_counters``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from air_transfer.cluster.fetch import get
from air_transfer.cluster.refs import ChunkRef
from air_transfer.config import MAX_CHUNK_BYTES
from air_transfer.core.checksum import chunk_checksum, is_checksum
from air_transfer.core.confine import checked_path, resolve
from air_transfer.core.file_chunks import chunks_of
from air_transfer.errors import ManifestError
from air_transfer.storage.node_api import ChunkAt, IndexedCommit, NodeIndexedUploads
from air_transfer.storage.server.incremental import IncrementalStore
from air_transfer.storage.server.uploads import DiskUploads


class StreamUploads(NodeIndexedUploads):
    """Chunks of upload streams reused from this node's disk, or fetched (``fetch``:
    a ref's value, ``ray.get`` but for tests of this layer alone)."""

    def __init__(
        self, uploads: DiskUploads, store: IncrementalStore, fetch: Callable[[Any], Any] = get
    ) -> None:
        self.uploads, self.store, self.fetch = uploads, store, fetch

    def fs_write_or_reuse(
        self, root: str, into: ChunkAt, checksum: str, length: int, sent: list[ChunkRef]
    ) -> bool:
        """Write the chunk of ``length`` bytes with ``checksum`` where ``into`` says:
        from a stored copy if one is proven now (True), else fetched through ``sent``
        (``[ref]``, nested so that nothing moves unless asked)."""
        if not isinstance(length, int) or not 0 < length <= MAX_CHUNK_BYTES:
            raise ValueError(f"a chunk length of 1..{MAX_CHUNK_BYTES} bytes, got {length!r}")
        view = self.store.reuse_chunk(root, checksum, length)
        if view is not None:
            self.uploads.write_proven(root, into, view)  # hashed once
            self.store.count({"bytes_written": length})
            return True
        [ref] = sent
        self.uploads.fs_write(root, into, self.fetch(ref), checksum)
        self.store.count({"chunks_sent": 1, "bytes_sent": length, "bytes_written": length})
        return False

    def _linked(
        self, root: str, staging: str, size: int, sums: tuple[str, ...], chunk_bytes: int
    ) -> bool:
        """Whether the staging file became a hard link of a stored file proven to hold
        exactly the stream's bytes (a shard unchanged since an earlier save)."""
        source = self.store.proven_file(root, size, sums, chunk_bytes)
        if source is None:
            return False
        try:
            linked = self.uploads.fs_link_staging(root, staging, source)
        finally:
            os.close(source)
        if linked:
            self.store.count({"files_linked": 1, "bytes_linked": size})
        return linked

    def fs_commit_indexed(self, root: str, commit: IndexedCommit) -> None:
        """``DiskUploads.fs_commit``, then the commit's ``path`` noted as holding
        per-file chunks of ``chunk_bytes`` with checksums ``sums`` (one per chunk, the
        tail's too), unless it is smaller than one chunk (a run's small files,
        rewritten at every report, would only grow the index)."""
        path, staging, size = commit.path, commit.staging, commit.size
        sums, chunk_bytes = tuple(commit.sums), commit.chunk_bytes
        if not isinstance(chunk_bytes, int) or not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
            self.uploads.fs_abort(root, staging)
            raise ValueError(f"a chunk size of 1..{MAX_CHUNK_BYTES} bytes, got {chunk_bytes!r}")
        if len(sums) != chunks_of(size, chunk_bytes) or not all(map(is_checksum, sums)):
            self.uploads.fs_abort(root, staging)
            raise ManifestError(
                f"{path!r}: {len(sums)} chunk checksums for a file of {size} bytes in "
                f"chunks of {chunk_bytes} (it has {chunks_of(size, chunk_bytes)}); "
                "nothing was stored"
            )
        tail_bytes = len(memoryview(commit.tail).cast("B"))
        try:
            linked = size >= chunk_bytes and self._linked(root, staging, size, sums, chunk_bytes)
        except BaseException:
            self.uploads.fs_abort(root, staging)
            raise
        if linked:  # the staging file holds every byte now, the tail's too
            commit = replace(commit, offset=size, tail=b"", checksum=chunk_checksum(b""))
        self.uploads.fs_commit(root, commit)
        self.store.count(
            {
                "files": 1,
                "chunks_sent": int(tail_bytes > 0),
                "bytes_sent": tail_bytes,
                "bytes_written": 0 if linked else tail_bytes,
            }
        )
        if size >= chunk_bytes:  # a file all tail has no chunk a stream would ask for
            try:  # a hint only: a path changed since the commit is not offered
                real = resolve(checked_path(root, path))
            except OSError:
                return
            self.store.note_file(root, real, size, sums, chunk_bytes)
