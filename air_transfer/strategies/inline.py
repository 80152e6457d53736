"""``inline``: the whole (small) checkpoint as one object.

One ``ray.put`` and one ``ray.get``: the lowest latency for checkpoints of a few MiB,
where per-chunk overhead would dominate. Refused above ``inline_max_bytes``, which the
config keeps within ``window x chunk_bytes``, so it never breaks the memory bound.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import ray

from air_transfer.config import TransferConfig
from air_transfer.fetch import get
from air_transfer.layout import Source, Stamp
from air_transfer.manifest import Entry, Manifest, chunk_checksum
from air_transfer.packing import read_chunks
from air_transfer.strategies.agent_tasks import agent_can_read, submit_pack_stream
from air_transfer.strategies.base import Packed, TransferStrategy


class InlineStrategy(TransferStrategy):
    """The file stream in one numpy array; the payload is its ObjectRef."""

    name = "inline"

    def pack(
        self,
        source: Source,
        files: Sequence[Entry],
        stamps: Sequence[Stamp],
        config: TransferConfig,
    ) -> Packed:
        self._check_size(source, files, config)
        stream = np.empty(sum(f.size for f in files), dtype=np.uint8)
        cb = config.chunk_bytes
        chunks = read_chunks(
            source, files, stamps, cb, lambda i, n: memoryview(stream)[i * cb : i * cb + n]
        )
        checksums = tuple(chunk_checksum(view) for _, view in chunks)
        return Packed(ray.put(stream), checksums)

    def submit(
        self,
        source: Source,
        files: Sequence[Entry],
        stamps: Sequence[Stamp],
        config: TransferConfig,
    ) -> Packed:
        """One task in this node's agent that returns the stream and the checksum of
        each of its chunks as separate objects."""
        self._check_size(source, files, config)
        if not agent_can_read(source):
            return self.pack(source, files, stamps, config)
        stream, checksums = submit_pack_stream(source, files, stamps, config.chunk_bytes)
        return Packed(stream, tuple(checksums))

    def _check_size(self, source: Source, files: Sequence[Entry], config: TransferConfig) -> None:
        total = sum(f.size for f in files)
        if total > config.inline_limit:
            raise ValueError(
                f"the 'inline' strategy holds a whole checkpoint in memory; "
                f"{source.root!r} has {total} bytes of files, over "
                f"inline_max_bytes={config.inline_limit}. Use 'chunked' or raise "
                "TransferConfig.inline_max_bytes"
            )

    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Iterator[Any]:
        stream = get(payload)
        cb = manifest.chunk_bytes
        for index in range(start, stop):
            yield stream[index * cb : index * cb + manifest.chunk_length(index)]
