"""``inline``: the whole (small) checkpoint as one object.

One ``ray.put`` and one ``ray.get``: the lowest latency for checkpoints of a few MiB,
where per-chunk overhead would dominate. Refused above ``inline_max_bytes``, which the
config keeps within ``window x chunk_bytes``, so it never breaks the memory bound.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from air_transfer.cluster.fetch import get
from air_transfer.config import TransferConfig
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.manifest import Manifest
from air_transfer.core.proven_read import read_chunks
from air_transfer.core.scan import Source
from air_transfer.transfer.strategies.base import (
    Chunks,
    Layout,
    Packed,
    PackRequest,
    TransferStrategy,
)


class InlineStrategy(TransferStrategy):
    """The file stream in one numpy array; the payload is its ObjectRef."""

    name = "inline"
    layout = Layout.OBJECT
    chunks_kept = True  # object-store chunks, pinned by the views written from them

    def pack(self, request: PackRequest) -> Packed:
        self.check(request.source, request.total_bytes, request.config)
        stream = np.empty(request.total_bytes, dtype=np.uint8)
        cb = request.chunk_bytes
        chunks = read_chunks(
            request.source,
            request.files,
            request.stamps,
            cb,
            lambda i, n: memoryview(stream)[i * cb : i * cb + n],
        )
        checksums = tuple(chunk_checksum(view) for _, view in chunks)
        return Packed(ray.put(stream), checksums)

    def check(self, source: Source, total_bytes: int, config: TransferConfig) -> None:
        total, limit = total_bytes, config.inline_limit
        if total > limit:
            raise ValueError(
                f"the 'inline' strategy holds a whole checkpoint in memory; "
                f"{source.root!r} has {total} bytes of files, over "
                f"inline_max_bytes={limit}. Use 'chunked' or raise "
                "TransferConfig.inline_max_bytes"
            )

    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Chunks:
        stream = get(payload)
        cb = manifest.chunk_bytes
        for index in range(start, stop):
            yield stream[index * cb : index * cb + manifest.chunk_length(index)]

    def refs(self, payload: Any) -> list[ray.ObjectRef[Any]]:
        return [payload]
