"""Node storage, the wire: an incremental upload stream (``TransferConfig(incremental=
True)``; what torch DCP's shards are written through). Checksums first: only the
chunks the storage node does not hold travel.

The stream is cut into per-file chunks (offset 0 starts one, every ``chunk_bytes``:
``core.file_chunks``), so an unchanged region of a file (a frozen tensor) is the
same chunk in every save. Each full chunk is put in this node's object store and
the storage node is asked, with its checksum and a ref to it, to write it
(``fs_write_or_reuse``): it copies a proven stored copy from its own disk, or
fetches the chunk through the ref. At most ``window`` chunks await an answer; each
stays in this node's store until answered, then goes. The tail (the last, partial
chunk) is asked about too when it is at least a quarter of a chunk (a DCP shard's
last tensor, frozen); a smaller one travels with the commit, as a ``ChunkWriter``'s
does, a question costing more than its bytes. The commit hands over every chunk's
checksum, so the file can serve later saves. Publishing and aborting are
``ChunkWriter``'s: whole at ``close``, nothing otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from air_transfer.core.checksum import chunk_checksum
from air_transfer.storage.client.uploads import ChunkWriter
from air_transfer.storage.node_api import IndexedCommit, NodeIndexedUploads


class IncrementalChunkWriter(ChunkWriter):
    """A ``ChunkWriter`` whose chunks are sent only if the storage node lacks them.
    Only for a write from offset 0 (an append's chunks would not start at file
    offsets that are multiples of ``chunk_bytes``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.offset:
            raise ValueError("an incremental upload starts at offset 0 of its file")
        self.sums: list[str] = []  # every chunk's checksum, in file order

    def _submit(self, chunk: np.ndarray, offset: int, checksum: str) -> ray.ObjectRef[Any]:
        link, length = self.link, len(chunk)
        body = ray.put(chunk)  # a copy: the caller may reuse its buffer
        self.sums.append(checksum)
        return link.submit(
            NodeIndexedUploads.fs_write_or_reuse,
            link.root,
            self.staging,
            offset,
            checksum,
            length,
            [body],
            link.config.direct_io,
        )

    def _commit(self, tail: Any, checksum: str, size: int) -> None:
        link, offset = self.link, self.offset
        if len(tail) and 4 * len(tail) >= self.chunk_bytes:  # asked as a full chunk is
            link.wait(self._submit(tail, offset, checksum))
            offset, tail, checksum = offset + len(tail), b"", chunk_checksum(b"")
        elif len(tail):
            self.sums.append(checksum)
        commit = IndexedCommit(
            self.local, self.staging, offset, tail, checksum, size, link.config.direct_io,
            self.expect, sums=tuple(self.sums), chunk_bytes=self.chunk_bytes,
        )  # fmt: skip
        link.call(NodeIndexedUploads.fs_commit_indexed, link.root, commit)
