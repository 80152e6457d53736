"""File bodies of the node storage filesystem, moved in chunks through the object
store with a bounded number in flight.

A read is the agent's streaming generator (the one that serves the ``streamed``
strategy) over one file, consumed by the generator-backed ``ChunkFileReader``:
``window`` chunks ahead, and a seek to another chunk starts a new stream there. A write
is cut into ``chunk_bytes`` chunks, each sent to the agent with its checksum, at most
``window`` unacknowledged; ``close`` commits (``local_uploads``). Memory stays at a
few chunks on both ends whatever the file size.
"""

from __future__ import annotations

import contextlib
import io
import posixpath
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.fs as pafs
import ray
from ray.exceptions import RayTaskError

from air_transfer.errors import SourceChangedError
from air_transfer.layout import Source
from air_transfer.manifest import Entry, chunk_checksum
from air_transfer.reader import ChunkFileReader

if TYPE_CHECKING:
    from air_transfer.node_storage import NodeStorageHandler


def open_reader(fs: NodeStorageHandler, path: str, local: str, size: int) -> io.BufferedReader:
    """A seekable stream over the ``size`` bytes of the file at node path ``local``."""
    cb = fs.config.chunk_bytes
    raw = ChunkFileReader(path, size, 0, cb, lambda first: _chunks(fs, local, size, first))
    return io.BufferedReader(raw, buffer_size=min(max(cb, io.DEFAULT_BUFFER_SIZE), 1 << 20))


def _chunks(
    fs: NodeStorageHandler, local: str, size: int, first: int
) -> Iterator[tuple[int, memoryview]]:
    """Chunks ``first``.. of the file at ``local``, streamed by the agent."""
    cb = fs.config.chunk_bytes
    if first * cb >= size:
        return
    parent, name = posixpath.split(local)
    with fs.agent_errors():
        refs = (
            fs.agent()
            .stream.options(
                num_returns="streaming",
                _generator_backpressure_num_objects=fs.config.window,
            )
            .remote(
                Source(pafs.LocalFileSystem(), parent),
                [Entry(name, "file", size)],
                cb,
                (),  # no checksums to verify against: the file is read as it is now
                first,
                None,
                False,
            )
        )
        for index, ref in enumerate(refs, first):
            try:
                chunk = ray.get(ref)
            except RayTaskError as e:
                if isinstance(e.cause, SourceChangedError):
                    raise SourceChangedError(
                        f"{local!r} on node {fs.node_id} changed size while being read "
                        f"(chunk {index}); read it again"
                    ) from None
                raise
            del ref  # the store frees the chunk once it is consumed
            yield index, memoryview(chunk).cast("B")


class ChunkWriter(io.RawIOBase):
    """Cuts what is written into ``chunk_bytes`` chunks and sends each to the agent,
    waiting once ``window`` are unacknowledged; ``close`` commits the file."""

    def __init__(self, fs: NodeStorageHandler, local: str, staging: str, start: int) -> None:
        super().__init__()
        self.fs, self.local, self.staging = fs, local, staging
        self.chunk_bytes, self.window = fs.config.chunk_bytes, fs.config.window
        self.offset = start  # where the next sent chunk goes in the staging file
        self.written = 0
        self.buffer: np.ndarray | None = None
        self.filled = 0
        self.pending: deque[ray.ObjectRef] = deque()
        self.failed = False

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.written

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError(f"write to closed file {self.local!r}")
        if self.failed:
            raise OSError(f"an earlier write to {self.local!r} failed; it will not be stored")
        try:
            return self._write(memoryview(data).cast("B"))
        except BaseException:
            self.failed = True  # close() then discards the upload: it may have a hole
            raise

    def _write(self, view: memoryview) -> int:
        n, cb = len(view), self.chunk_bytes
        while view:
            if not self.filled and len(view) >= cb:  # a whole chunk: no copy here
                self._send(np.frombuffer(view[:cb], dtype=np.uint8))
                view = view[cb:]
                continue
            if self.buffer is None:
                self.buffer = np.empty(cb, dtype=np.uint8)
            take = min(cb - self.filled, len(view))
            self.buffer[self.filled : self.filled + take] = view[:take]
            self.filled += take
            view = view[take:]
            if self.filled == cb:
                self._send(self.buffer)  # Ray copies an argument into the store on submit
                self.filled = 0
        self.written += n
        return n

    def _send(self, chunk: np.ndarray) -> None:
        while len(self.pending) >= self.window:
            self._wait(self.pending.popleft())
        agent = self.fs.agent()
        call = agent.fs_write.remote(
            self.fs.root,
            self.staging,
            self.offset,
            chunk,
            chunk_checksum(chunk),
            self.fs.config.direct_io,
        )
        self.pending.append(call)
        self.offset += len(chunk)

    def _wait(self, ref: ray.ObjectRef) -> None:
        with self.fs.agent_errors():
            ray.get(ref)

    def close(self) -> None:
        """Commit the file: it appears whole, or (after a failed write) not at all."""
        if self.closed:
            return
        try:
            if self.failed:
                self.fs.call_agent("fs_abort", self.staging)
                return
            while self.pending:
                self._wait(self.pending.popleft())
            tail = self.buffer[: self.filled] if self.buffer is not None else b""
            self.fs.call_agent(
                "fs_commit",
                self.local,
                self.staging,
                self.offset,
                tail,
                chunk_checksum(tail),
                self.offset + self.filled,
                self.fs.config.direct_io,
            )
        except BaseException:
            with contextlib.suppress(Exception):
                self.fs.call_agent("fs_abort", self.staging)
            raise
        finally:
            self.buffer = None
            self.pending.clear()
            super().close()
