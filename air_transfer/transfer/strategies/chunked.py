"""``chunked``: every chunk is its own object in the Ray object store.

Any number of readers anywhere in the cluster can fetch the chunks, in any order,
for as long as the payload is referenced. Chunks are numpy uint8 arrays so Ray stores
them out of band and ``ray.get`` returns a zero-copy view into shared memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from air_transfer.cluster.fetch import fetch_in_order
from air_transfer.cluster.refs import ChunkRef
from air_transfer.config import TransferConfig
from air_transfer.core.manifest import Manifest
from air_transfer.transfer.strategies.base import (
    Chunks,
    Layout,
    Packed,
    PackRequest,
    TransferStrategy,
)


class ChunkedStrategy(TransferStrategy):
    """One ``ray.put`` per chunk; the payload is the list of chunk ObjectRefs."""

    name = "chunked"
    layout = Layout.CHUNKS
    chunks_kept = True  # object-store chunks, pinned by the views written from them

    def pack(self, request: PackRequest) -> Packed:
        refs: list[ChunkRef] = []
        checksums: list[str] = []
        for _index, view, checksum in request.chunks():
            # ray.put copies the buffer into the object store before returning, so the
            # reader thread may refill it right after.
            refs.append(ray.put(np.frombuffer(view, dtype=np.uint8)))
            checksums.append(checksum)
        return Packed(refs, tuple(checksums))

    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Chunks:
        return fetch_in_order(payload[start:stop], config.window)

    def refs(self, payload: Any) -> list[ray.ObjectRef[Any]]:
        return list(payload)
