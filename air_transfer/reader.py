"""The generator-backed reader: chunks in order with a bounded prefetch window, and a
file-like stream over one file's bytes.

Memory stays O(window x chunk_bytes) whatever the checkpoint size: at most ``window``
chunks are being fetched or held ahead of the one being consumed, and numpy chunks
come back from ``ray.get`` as read-only views into shared memory, not private copies.
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import ray

#: Gets in flight beyond this many threads only queue: Ray pulls a few large objects
#: at a time per node anyway, and threads cost memory.
_MAX_FETCH_THREADS = 8


def fetch_in_order(refs: Iterable[ray.ObjectRef], window: int) -> Iterator[Any]:
    """Yield ``ray.get(ref)`` for each ref in order (a list, or a streaming
    generator's refs as they come), keeping up to ``window`` gets in flight ahead so
    cross-node pulls overlap with the consumer's work.

    Threads, not ``ray.wait(fetch_local=True)``: a get in flight is a pull that Ray
    keeps going, and its result is dropped as soon as the consumer moves on.
    """
    pending: deque[Future[Any]] = deque()
    threads = min(window, _MAX_FETCH_THREADS)
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="air-transfer-fetch")
    try:
        upcoming = iter(refs)
        for ref in upcoming:
            pending.append(pool.submit(ray.get, ref))
            if len(pending) >= window:
                break
        while pending:
            result = pending.popleft().result()
            nxt = next(upcoming, None)
            if nxt is not None:
                pending.append(pool.submit(ray.get, nxt))
            yield result
            del result
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=False, cancel_futures=True)


#: A function that yields ``(chunk_index, chunk_view)`` from a given chunk index on,
#: already verified.
ChunkOpener = Callable[[int], Iterator[tuple[int, memoryview]]]


class ChunkFileReader(io.RawIOBase):
    """A seekable, read-only raw stream over one file inside the chunk stream.

    Sequential reads pull chunks from one generator; a seek to another chunk starts a
    new generator there, so reading a 100 GB checkpoint's last file does not fetch
    the 100 GB before it.
    """

    def __init__(
        self, name: str, size: int, stream_offset: int, chunk_bytes: int, open_chunks: ChunkOpener
    ) -> None:
        super().__init__()
        self.name = name
        self._size = size
        self._start = stream_offset
        self._chunk_bytes = chunk_bytes
        self._open_chunks = open_chunks
        self._pos = 0
        self._chunks: Iterator[tuple[int, memoryview]] | None = None
        self._index = -1
        self._view: memoryview | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(f"negative seek position {base + offset} in {self.name!r}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError(f"read from closed file {self.name!r}")
        out = memoryview(buffer).cast("B")
        want = min(len(out), self._size - self._pos)
        done = 0
        while done < want:
            absolute = self._start + self._pos
            view = self._chunk_at(absolute // self._chunk_bytes)
            inner = absolute - self._index * self._chunk_bytes
            n = min(want - done, len(view) - inner)
            out[done : done + n] = view[inner : inner + n]
            done += n
            self._pos += n
        return done

    def _chunk_at(self, index: int) -> memoryview:
        if index == self._index and self._view is not None:
            return self._view
        if self._chunks is None or index != self._index + 1:
            self._restart(index)
        assert self._chunks is not None
        try:
            self._index, self._view = next(self._chunks)
        except StopIteration:
            raise OSError(f"chunk stream ended before the end of {self.name!r}") from None
        return self._view

    def _restart(self, index: int) -> None:
        if self._chunks is not None:
            self._chunks.close()  # type: ignore[attr-defined]
        self._chunks = self._open_chunks(index)
        self._view = None

    def close(self) -> None:
        if self._chunks is not None:
            self._chunks.close()  # type: ignore[attr-defined]
            self._chunks = None
        self._view = None
        super().close()
