"""Chunks read and hashed one ahead in a background thread while the caller stores
the current one, through a ring of three reusable buffers (memory: 3 chunks)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.entry import Entry
from air_transfer.core.proven_read import read_chunks
from air_transfer.core.scan import Source, Stamp
from air_transfer.core.threads import start_daemon

_DONE = object()


def read_chunks_ahead(
    source: Source,
    files: Sequence[Entry],
    stamps: Sequence[Stamp],
    chunk_bytes: int,
    start_chunk: int = 0,
    stop_chunk: int | None = None,
    checksums: bool = True,
) -> Iterator[tuple[int, memoryview, str]]:
    """Yield ``(index, view, checksum)`` for every chunk, reading and hashing the next
    chunk in a background thread while the caller stores the current one (without
    ``checksums`` the checksum is "": a copy that never leaves the process).

    A ring of three reusable buffers bounds memory at ``3 x chunk_bytes``: the thread
    fills one while one waits in the hand-off queue and the caller holds the third.
    A view is valid until the caller asks for the next chunk.
    """
    size = min(chunk_bytes, sum(f.size for f in files))
    ring = [np.empty(size, dtype=np.uint8) for _ in range(3)]
    handoff: queue.Queue[Any] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def offer(item: Any) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            chunks = read_chunks(
                source,
                files,
                stamps,
                chunk_bytes,
                lambda i, n: memoryview(ring[i % 3])[:n],
                start_chunk,
                stop_chunk,
            )
            for index, view in chunks:
                checksum = chunk_checksum(view) if checksums else ""
                if not offer((index, view, checksum)):
                    chunks.close()
                    return
            offer(_DONE)
        except BaseException as e:  # handed to the caller's thread and re-raised there
            offer(e)

    thread = start_daemon("air-transfer-pack", produce)
    try:
        while True:
            item = handoff.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()
