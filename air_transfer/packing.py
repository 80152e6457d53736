"""Read a checkpoint's files end to end into chunk buffers, with checksums.

Plain Python (no Ray), shared by every strategy: a strategy decides where a filled
chunk goes (one big object, one object per chunk, a stream), this module fills it.
Files are read with ``readinto`` straight into the caller's buffer, never through an
intermediate ``bytes``; a file whose size changed since the scan is an error, not a
silently short or truncated chunk.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from air_transfer.errors import SourceChangedError
from air_transfer.layout import Source, iter_chunk_spans
from air_transfer.manifest import Entry, chunk_checksum


class _OpenFile:
    """The file currently being read, with how far into it we are."""

    def __init__(self, source: Source, entry: Entry) -> None:
        self.entry = entry
        self.where = f"{source.root.rstrip('/')}/{entry.path}"
        try:
            self.handle = source.open(entry.path)
        except FileNotFoundError as e:
            raise SourceChangedError(
                f"checkpoint file {self.where!r} vanished after the directory was scanned"
            ) from e
        self.position = 0

    def readinto(self, view: memoryview) -> None:
        filled = 0
        while filled < len(view):
            n = self.handle.readinto(view[filled:])
            if not n:
                raise SourceChangedError(
                    f"checkpoint file {self.where!r} shrank while being packed: "
                    f"scanned at {self.entry.size} bytes, ended after "
                    f"{self.position + filled}"
                )
            filled += n
        self.position += filled

    def close(self) -> None:
        """Close, checking the file did not grow past its scanned size (when it was
        read to that size: a stream that stops mid-file cannot tell)."""
        try:
            extra = self.handle.read(1) if self.position == self.entry.size else b""
        finally:
            self.handle.close()
        if extra:
            raise SourceChangedError(
                f"checkpoint file {self.where!r} grew while being packed: scanned at "
                f"{self.entry.size} bytes, has more; re-pack once it is stable"
            )


def read_chunks(
    source: Source,
    files: Sequence[Entry],
    chunk_bytes: int,
    buffer_for: Callable[[int, int], memoryview],
    start_chunk: int = 0,
    stop_chunk: int | None = None,
) -> Iterator[tuple[int, memoryview]]:
    """Yield ``(index, view)`` for chunks ``start_chunk``..``stop_chunk - 1`` (default:
    to the end), each filled with the stream's bytes.

    ``buffer_for(index, length)`` supplies a writable buffer of exactly ``length``
    bytes; the caller owns it and may reuse it once it moves on.
    """
    sizes = [f.size for f in files]
    total = sum(sizes)
    current: _OpenFile | None = None
    try:
        for index, spans in enumerate(
            iter_chunk_spans(sizes, chunk_bytes, start_chunk), start_chunk
        ):
            if stop_chunk is not None and index >= stop_chunk:
                return
            length = min(chunk_bytes, total - index * chunk_bytes)
            view = buffer_for(index, length)
            for span in spans:
                if current is None or current.entry is not files[span.file_index]:
                    if current is not None:
                        current.close()
                    current = _OpenFile(source, files[span.file_index])
                    if span.file_offset:
                        current.handle.seek(span.file_offset)
                        current.position = span.file_offset
                current.readinto(view[span.chunk_offset : span.chunk_offset + span.length])
            yield index, view
        if current is not None:
            last, current = current, None
            last.close()
    finally:
        if current is not None:
            current.handle.close()


_DONE = object()


def read_chunks_ahead(
    source: Source,
    files: Sequence[Entry],
    chunk_bytes: int,
    start_chunk: int = 0,
    stop_chunk: int | None = None,
) -> Iterator[tuple[int, memoryview, str]]:
    """Yield ``(index, view, checksum)`` for every chunk, reading and hashing the next
    chunk in a background thread while the caller stores the current one.

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
                chunk_bytes,
                lambda i, n: memoryview(ring[i % 3])[:n],
                start_chunk,
                stop_chunk,
            )
            for index, view in chunks:
                if not offer((index, view, chunk_checksum(view))):
                    chunks.close()
                    return
            offer(_DONE)
        except BaseException as e:  # handed to the caller's thread and re-raised there
            offer(e)

    thread = threading.Thread(target=produce, name="air-transfer-pack", daemon=True)
    thread.start()
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
