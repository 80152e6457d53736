"""A user-defined strategy, registered only by the tests: proves that the registry is
open and that a custom strategy is selected by name and used end to end."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import ray

from air_transfer import Packed, TransferConfig, TransferStrategy
from air_transfer.core.layout import Source, Stamp
from air_transfer.core.manifest import Entry, Manifest, chunk_checksum
from air_transfer.core.packing import read_chunks


class BytesChunksStrategy(TransferStrategy):
    """Each chunk as a plain ``bytes`` object (the naive loop from the bench report),
    fetched one at a time: different enough from ``chunked`` to exercise the
    interface, not the fast path."""

    name = "test-bytes"

    def pack(
        self,
        source: Source,
        files: Sequence[Entry],
        stamps: Sequence[Stamp],
        config: TransferConfig,
    ) -> Packed:
        refs, sums = [], []
        buf = bytearray(config.chunk_bytes)
        for _, view in read_chunks(
            source, files, stamps, config.chunk_bytes, lambda i, n: memoryview(buf)[:n]
        ):
            sums.append(chunk_checksum(view))
            refs.append(ray.put(bytes(view)))
        return Packed(refs, tuple(sums))

    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Iterator[Any]:
        for ref in payload[start:stop]:
            yield ray.get(ref)
