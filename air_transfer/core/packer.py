"""``ChunkPacker``: the node agent's packing step, chunks filled from their plans
into one reusable buffer per thread, and checksummed."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.plan import ChunkPlan
from air_transfer.core.proven_read import FileCursor, fill_chunk
from air_transfer.core.scan import Source


class ChunkPacker:
    """Fills chunks from their plans (a few per call, from any number of threads) into
    a reusable buffer per thread, and checksums them.

    For the node agent, which packs every chunk of every transfer on its node as one
    task each: a fresh chunk-sized buffer per task would fault in new pages every
    time (~8k page faults per 32 MiB chunk). The view ``pack`` returns stays valid
    until the same thread packs again; Ray stores a task's return value in the object
    store in the thread that ran the task, before that thread runs another, so an
    actor method may return it directly. Memory: one buffer per packing thread.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def _buffer(self, length: int) -> np.ndarray:
        buffer: np.ndarray | None = getattr(self._local, "buffer", None)
        if buffer is None or len(buffer) < length:
            buffer = self._local.buffer = np.empty(length, dtype=np.uint8)
        return buffer[:length]

    def pack(
        self, source: Source, plans: Sequence[ChunkPlan]
    ) -> tuple[list[np.ndarray], list[str]]:
        """The chunks of ``plans`` of ``source`` and their checksums, each proven
        against its plan's stamps (SourceChangedError otherwise); one buffer holds
        them all, so they stay valid together until this thread packs again."""
        buffer = self._buffer(sum(plan.length for plan in plans))
        chunks, checksums = [], []
        offset = 0
        with FileCursor(source) as cursor:
            for plan in plans:
                chunk = buffer[offset : offset + plan.length]
                fill_chunk(source, plan, memoryview(chunk), cursor)
                chunks.append(chunk)
                checksums.append(chunk_checksum(chunk))
                offset += plan.length
        return chunks, checksums

    def pack_into(
        self, source: Source, plans: Sequence[ChunkPlan], out: np.ndarray
    ) -> list[str]:
        """Fill ``out`` with the chunks of ``plans`` end to end (``inline``'s one
        object) and return their checksums."""
        checksums = []
        offset = 0
        with FileCursor(source) as cursor:
            for plan in plans:
                view = memoryview(out)[offset : offset + plan.length]
                fill_chunk(source, plan, view, cursor)
                checksums.append(chunk_checksum(view))
                offset += plan.length
        return checksums

    def checksums(self, source: Source, plans: Sequence[ChunkPlan]) -> list[str]:
        """Only the checksums of ``plans``' chunks (``streamed`` reads the bytes again
        at transfer time), through one chunk buffer."""
        return [self.pack(source, [plan])[1][0] for plan in plans]
