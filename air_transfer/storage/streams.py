"""Node storage, the wire: calls to the storage node's agent, and file bodies moved in
chunks through the object store with a bounded number in flight.

``AgentLink`` is the caller's connection to one storage node's agent: it finds the
agent by name, runs one disk operation per call, and turns Ray's wrappers back into
the OSError the agent raised. A read is the agent's streaming generator over one
file (``disk_reads``, confined to the storage root), consumed by the generator-backed
``ChunkFileReader``: ``window`` chunks ahead, and a seek to another chunk starts a new
stream there. A write is cut into ``chunk_bytes`` chunks, each sent to the agent with
its checksum, at most ``window`` unacknowledged; ``close`` commits (``disk_uploads``).
Memory stays at a few chunks on both ends whatever the file size.

An upload that does not end in ``close`` leaves nothing behind, whoever holds the
writer afterwards: a failed write aborts it at once (the exception's traceback keeps
the writer alive as long as the caller keeps the exception), and a writer dropped
unclosed aborts it when it is freed (pyarrow's ``copy_files`` drops the destination
stream without closing it when reading the source fails; ``io.IOBase`` would
otherwise close it, and so commit the truncated file).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import gc
import io
import logging
import queue
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError, RayTaskError

from air_transfer import _ray
from air_transfer.config import TransferConfig
from air_transfer.errors import SourceChangedError
from air_transfer.manifest import chunk_checksum
from air_transfer.nodes import live_node_ids, node_agent
from air_transfer.reader import ChunkFileReader, buffered

logger = logging.getLogger(__name__)


class AgentLink:
    """The connection from this process to the agent of storage node ``node_id``,
    for files under ``root``, moving bodies as ``config`` says."""

    def __init__(self, node_id: str, root: str, config: TransferConfig) -> None:
        self.node_id, self.root, self.config = node_id, root, config
        self._agent: Any = None
        self._lost = False

    def agent(self) -> Any:
        """The storage node's agent (an actor handle), started if needed."""
        if self._agent is None:
            if self.node_id not in live_node_ids():
                raise ConnectionError(
                    f"storage node {self.node_id} is not a live node of this Ray cluster; "
                    "files stored on it are unreachable"
                )
            self._agent = node_agent(self.node_id)
            if self._lost:
                self._lost = False
                logger.warning(
                    "air-transfer: the agent of storage node %s was lost; a new one was started",
                    self.node_id,
                )
        return self._agent

    def call(self, op: str, *args: Any) -> Any:
        """Disk operation ``op`` on the storage node with this storage's root and
        ``args``; its result."""
        with self.errors():
            return ray.get(self.agent().disk.remote(op, self.root, *args))

    def submit(self, op: str, *args: Any) -> ray.ObjectRef[Any]:
        """Start disk operation ``op`` and return its ref (wait with ``wait``)."""
        with self.errors():
            ref: ray.ObjectRef[Any] = self.agent().disk.remote(op, self.root, *args)
            return ref

    def wait(self, ref: ray.ObjectRef[Any]) -> Any:
        with self.errors():
            return ray.get(ref)

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Raise the OSError or ValueError the agent raised (FileNotFoundError naming
        the path, ...), not Ray's wrapper with the agent's traceback (kept for anything
        else: a bug); a lost agent or node as ConnectionError."""
        try:
            yield
        except RayTaskError as e:
            if isinstance(e.cause, (OSError, ValueError)):
                # A copy: raised here, e.cause itself would get e as its __context__
                # while e holds it as .cause, a reference cycle that keeps e's
                # traceback, and every frame in it (a ChunkWriter's among them),
                # alive until the cyclic garbage collector happens to run.
                raise copy.copy(e.cause) from None
            raise
        except RayActorError as e:
            self._agent, self._lost = None, True
            raise ConnectionError(
                f"the air-transfer agent of storage node {self.node_id} is unreachable "
                f"({type(e).__name__}); its files cannot be reached until it is back"
            ) from e


def open_reader(link: AgentLink, path: str, local: str, size: int) -> io.BufferedReader:
    """A seekable stream over the ``size`` bytes of the file at node path ``local``."""
    cb = link.config.chunk_bytes
    raw = ChunkFileReader(path, size, 0, cb, lambda first: _chunks(link, local, size, first))
    return buffered(raw, cb)


def _chunks(link: AgentLink, local: str, size: int, first: int) -> Iterator[tuple[int, memoryview]]:
    """Chunks ``first``.. of the file at ``local``, streamed by the agent."""
    cb = link.config.chunk_bytes
    if first * cb >= size:
        return
    with link.errors():
        refs = _ray.streaming(link.agent().disk_read, link.config.window).remote(
            link.root, local, size, cb, first
        )
        for index, ref in enumerate(refs, first):
            try:
                chunk = ray.get(ref)
            except RayTaskError as e:
                if isinstance(e.cause, SourceChangedError):
                    raise SourceChangedError(
                        errno.ESTALE,
                        f"{e.cause.strerror} (on node {link.node_id}, chunk {index}); "
                        "read it again",
                        local,
                    ) from None
                raise
            del ref  # the store frees the chunk once it is consumed
            yield index, memoryview(chunk).cast("B")


class ChunkWriter(io.RawIOBase):
    """Cuts what is written into ``chunk_bytes`` chunks and sends each to the agent,
    waiting once ``window`` are unacknowledged; ``close`` commits the file, and
    anything else (a failed write, being dropped unclosed) aborts it."""

    def __init__(
        self, link: AgentLink, local: str, staging: str, start: int, expect: Any = None
    ) -> None:
        super().__init__()
        self.link, self.local, self.staging = link, local, staging
        self.expect = expect  # what the commit expects at ``local`` (appends)
        self.chunk_bytes, self.window = link.config.chunk_bytes, link.config.window
        self.offset = start  # where the next sent chunk goes in the staging file
        self.written = 0
        self.buffer: np.ndarray | None = None
        self.filled = 0
        self.pending: deque[ray.ObjectRef[Any]] = deque()
        self.failed = False
        _reaper()  # started here, never from a finalizer

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.written

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError(f"write to closed file {self.local!r}")
        if self.failed:
            raise OSError(errno.EIO, "an earlier write failed; the file is not stored", self.local)
        try:
            return self._write(memoryview(data).cast("B"))
        except BaseException:
            self._abort()  # now: the staging file may have a hole
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
            self.link.wait(self.pending.popleft())
        call = self.link.submit(
            "fs_write",
            self.staging,
            self.offset,
            chunk,
            chunk_checksum(chunk),
            self.link.config.direct_io,
        )
        self.pending.append(call)
        self.offset += len(chunk)

    def close(self) -> None:
        """Commit the file: it appears whole, or (after a failed write) not at all."""
        if self.closed:
            return
        try:
            if self.failed:
                return  # aborted when the write failed
            while self.pending:
                self.link.wait(self.pending.popleft())
            tail = self.buffer[: self.filled] if self.buffer is not None else b""
            self.link.call(
                "fs_commit",
                self.local,
                self.staging,
                self.offset,
                tail,
                chunk_checksum(tail),
                self.offset + self.filled,
                self.link.config.direct_io,
                self.expect,
            )
        except BaseException:
            self._abort()
            raise
        finally:
            self.buffer = None
            super().close()

    def _abort(self) -> None:
        """Remove the staging file, once the chunk writes in flight are done (so that
        none fails unseen, and none lands after the removal)."""
        self.failed = True
        pending, self.pending = list(self.pending), deque()
        _abort_upload(self.link, self.staging, pending)

    def __del__(self) -> None:
        if not self.closed:  # dropped unclosed: the upload did not finish
            self.failed = True
            pending, self.pending = list(self.pending), deque()
            _reaper().abandon(self.link, self.staging, pending)
            io.RawIOBase.close(self)  # not self.close(): that would commit
        super().__del__()


def _abort_upload(link: AgentLink, staging: str, pending: list[ray.ObjectRef[Any]]) -> None:
    for ref in pending:
        with contextlib.suppress(Exception):
            link.wait(ref)
    try:
        link.call("fs_abort", staging)
    except Exception as e:  # the agent is gone: the file stays hidden, goes with its dir
        logger.warning("air-transfer: could not remove the staging file %s: %s", staging, e)


class _Reaper:
    """Aborts the uploads of writers dropped unclosed. Outside a garbage collection,
    at once in the dropping thread (pyarrow's, during ``copy_files``), so the staging
    file is gone when the failed call returns. During one, the finalizer may have
    interrupted any code, Ray's included, so it only hands the work to this thread
    (``SimpleQueue.put`` is safe there)."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[tuple[AgentLink, str, list[ray.ObjectRef[Any]]]]
        self.queue = queue.SimpleQueue()
        self.collecting = False
        gc.callbacks.append(self._phase)
        threading.Thread(target=self._run, name="air-transfer-aborts", daemon=True).start()

    def _phase(self, phase: str, info: dict[str, Any]) -> None:
        self.collecting = phase == "start"

    def abandon(self, link: AgentLink, staging: str, pending: list[ray.ObjectRef[Any]]) -> None:
        if self.collecting:
            self.queue.put((link, staging, pending))
        else:
            _abort_upload(link, staging, pending)

    def _run(self) -> None:
        while True:
            _abort_upload(*self.queue.get())


@functools.cache
def _reaper() -> _Reaper:
    return _Reaper()
