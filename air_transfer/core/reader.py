"""A seekable file-like stream over one file inside a chunk stream.

The chunks come from a generator (``ChunkOpener``) that the transfer side supplies,
already verified and fetched with a bounded window ahead (``air_transfer.cluster.fetch``), so
memory stays O(window x chunk_bytes) whatever the file size. Plain Python.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from air_transfer.core.knobs import KNOBS

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

#: ``(first, last)``: a generator of ``(chunk_index, chunk_view)`` from chunk ``first``
#: on, already verified. ``last`` is the chunk where the read that opened it ends: an
#: opener may wait until the reader asks for more before fetching beyond it.
ChunkOpener = Callable[[int, int], Iterator[tuple[int, memoryview]]]


class SeekableReader(io.RawIOBase):
    """A read-only raw stream that seeks: the answers every such stream gives, from
    its position (``_pos``, kept by the subclass)."""

    _pos: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos


class ChunkFileReader(SeekableReader):
    """A seekable, read-only raw stream over one file inside the chunk stream.

    Sequential reads pull chunks from one generator; a seek to another chunk starts a
    new generator there, so reading a 100 GB checkpoint's last file does not fetch
    the 100 GB before it. The generator is told where the read that started it ends,
    so a read of a byte range (torch DCP's) need not fetch ahead of it.
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

    def size(self) -> int:
        return self._size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(f"negative seek position {base + offset} in {self.name!r}")
        self._pos = base + offset
        return self._pos

    def read(self, size: int | None = -1) -> Any:
        """``size`` bytes from the current position (fewer only at the end): a view of
        the chunk that holds them when one does (no copy; pyarrow's ``PythonFile``
        takes any buffer), else a copy across chunks. ``read()`` reads to the end."""
        if size is None or size < 0:
            return self.readall()
        first = self._read_view(size)
        if len(first) == size or len(first) == 0 or self._pos >= self._size:
            return first
        parts = [bytes(first)]
        left = size - len(first)
        while left and (part := self._read_view(left)):
            parts.append(bytes(part))
            left -= len(part)
        return b"".join(parts)

    def readall(self) -> bytes:
        parts = []
        while part := self._read_view(self._size - self._pos):
            parts.append(bytes(part))
        return b"".join(parts)

    def _read_view(self, size: int) -> memoryview | bytes:
        if self.closed:
            raise ValueError(f"read from closed file {self.name!r}")
        if size == 0 or self._pos >= self._size:
            return b""
        absolute = self._start + self._pos
        n = min(size, self._size - self._pos)
        view = self._chunk_at(absolute // self._chunk_bytes, self._last(absolute, n))
        inner = absolute - self._index * self._chunk_bytes
        n = min(n, len(view) - inner)
        self._pos += n
        return view[inner : inner + n]

    def readinto(self, buffer: Buffer) -> int:
        if self.closed:
            raise ValueError(f"read from closed file {self.name!r}")
        out = memoryview(buffer).cast("B")
        want = min(len(out), self._size - self._pos)
        done = 0
        while done < want:
            absolute = self._start + self._pos
            view = self._chunk_at(absolute // self._chunk_bytes, self._last(absolute, want - done))
            inner = absolute - self._index * self._chunk_bytes
            n = min(want - done, len(view) - inner)
            out[done : done + n] = view[inner : inner + n]
            done += n
            self._pos += n
        return done

    def _last(self, absolute: int, n: int) -> int:
        """The chunk holding the last of ``n`` bytes from stream offset ``absolute``."""
        return (absolute + max(n, 1) - 1) // self._chunk_bytes

    def _chunk_at(self, index: int, last: int) -> memoryview:
        if index == self._index and self._view is not None:
            return self._view
        if self._chunks is None or index != self._index + 1:
            self._restart(index, last)
        assert self._chunks is not None
        try:
            self._index, self._view = next(self._chunks)
        except StopIteration:
            raise OSError(f"chunk stream ended before the end of {self.name!r}") from None
        return self._view

    def _restart(self, index: int, last: int) -> None:
        if self._chunks is not None:
            self._chunks.close()  # type: ignore[attr-defined]
        self._chunks = self._open_chunks(index, last)
        self._view = None

    def close(self) -> None:
        if self._chunks is not None:
            self._chunks.close()  # type: ignore[attr-defined]
            self._chunks = None
        self._view = None
        super().close()


def buffered(raw: ChunkFileReader, chunk_bytes: int) -> io.BufferedReader:
    """``raw`` behind a read buffer (``KNOBS.read_buffer_bytes`` at most): callers
    such as pyarrow read in small pieces, which should not each walk the chunks."""
    size = min(max(chunk_bytes, io.DEFAULT_BUFFER_SIZE), KNOBS.read_buffer_bytes)
    return io.BufferedReader(raw, buffer_size=size)
