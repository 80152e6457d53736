"""``chunked``: every chunk is its own object in the Ray object store.

Any number of readers anywhere in the cluster can fetch the chunks, in any order,
for as long as the payload is referenced. Chunks are numpy uint8 arrays so Ray stores
them out of band and ``ray.get`` returns a zero-copy view into shared memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import ray

from air_transfer.cluster.fetch import fetch_in_order
from air_transfer.config import TransferConfig
from air_transfer.core.entry import Entry
from air_transfer.core.manifest import Manifest
from air_transfer.core.readahead import read_chunks_ahead
from air_transfer.core.scan import Source, Stamp
from air_transfer.transfer.strategies.agent_tasks import agent_can_read, submit_pack_chunks
from air_transfer.transfer.strategies.base import Packed, TransferStrategy


class ChunkedStrategy(TransferStrategy):
    """One ``ray.put`` per chunk; the payload is the list of chunk ObjectRefs."""

    name = "chunked"

    def pack(
        self,
        source: Source,
        files: Sequence[Entry],
        stamps: Sequence[Stamp],
        config: TransferConfig,
    ) -> Packed:
        refs: list[ray.ObjectRef[Any]] = []
        checksums: list[str] = []
        for _index, view, checksum in read_chunks_ahead(source, files, stamps, config.chunk_bytes):
            # ray.put copies the buffer into the object store before returning, so the
            # reader thread may refill it right after.
            refs.append(ray.put(np.frombuffer(view, dtype=np.uint8)))
            checksums.append(checksum)
        return Packed(refs, tuple(checksums))

    def submit(
        self,
        source: Source,
        files: Sequence[Entry],
        stamps: Sequence[Stamp],
        config: TransferConfig,
    ) -> Packed:
        """One ``pack_chunk`` task per chunk in this node's agent (``agent_tasks``);
        a source the agent cannot receive is packed here."""
        if not agent_can_read(source):
            return self.pack(source, files, stamps, config)
        data, checksums = submit_pack_chunks(source, files, stamps, config.chunk_bytes)
        return Packed(data, tuple(checksums))

    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Iterator[Any]:
        return fetch_in_order(payload[start:stop], config.window)
