"""A user-defined strategy, registered only by the tests: proves that the registry is
open and that a custom strategy is selected by name and used end to end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ray

from air_transfer import TransferConfig
from air_transfer.core.manifest import Manifest
from air_transfer.extend import Packed, PackRequest, TransferStrategy


class BytesChunksStrategy(TransferStrategy):
    """Each chunk as a plain ``bytes`` object (the naive loop from the bench report),
    fetched one at a time: different enough from ``chunked`` to exercise the
    interface, not the fast path."""

    name = "test-bytes"

    def pack(self, request: PackRequest) -> Packed:
        refs, sums = [], []
        for _, view, checksum in request.chunks():
            sums.append(checksum)
            refs.append(ray.put(bytes(view)))
        return Packed(refs, tuple(sums))

    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Iterator[Any]:
        for ref in payload[start:stop]:
            yield ray.get(ref)
