"""Node storage, the wire: writes. ``ChunkWriter`` cuts what is written into
``chunk_bytes`` chunks and sends each to the storage node's agent with its checksum,
at most ``window`` unacknowledged; ``close`` commits the file (``disk_uploads``).

An upload that does not end in ``close`` leaves nothing behind, whoever holds the
writer afterwards: a failed write aborts it at once (the exception's traceback keeps
the writer alive as long as the caller keeps the exception), and a writer dropped
unclosed aborts it when it is freed (pyarrow's ``copy_files`` drops the destination
stream without closing it when reading the source fails; ``io.IOBase`` would
otherwise close it, and so commit the truncated file).
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
from collections import deque
from typing import Any

import numpy as np
import ray

from air_transfer.core.checksum import chunk_checksum
from air_transfer.observe import deferred
from air_transfer.observe.telemetry import Transfer, dropped_error
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.node_api import Commit, NodeFiles

logger = logging.getLogger(__name__)


class UploadStream(io.RawIOBase):
    """What every node-storage upload stream shares: writable, ``tell`` is the bytes
    written, and no write after ``close`` or after a failed write (``failed``), which
    has already aborted the upload. Subclasses set ``local``, ``written``, ``failed``."""

    local: str
    written: int
    failed: bool

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.written

    def check_writable(self) -> None:
        """Refuse a write to a closed stream or one whose upload was aborted."""
        if self.closed:
            raise ValueError(f"write to closed file {self.local!r}")
        if self.failed:
            raise OSError(errno.EIO, "an earlier write failed; the file is not stored", self.local)


class ChunkWriter(UploadStream):
    """Cuts what is written into ``chunk_bytes`` chunks and sends each to the agent,
    waiting once ``window`` are unacknowledged; ``close`` commits the file, and
    anything else (a failed write, being dropped unclosed) aborts it."""

    def __init__(
        self,
        link: AgentLink,
        local: str,
        staging: str,
        start: int,
        expect: Any = None,
        transfer: Transfer | None = None,
    ) -> None:
        super().__init__()
        self.transfer = transfer  # the upload's metrics and bar: a chunk counts once sent
        self.link, self.local, self.staging = link, local, staging
        self.expect = expect  # what the commit expects at ``local`` (appends)
        self.chunk_bytes, self.window = link.config.chunk_bytes, link.config.window
        self.offset = start  # where the next sent chunk goes in the staging file
        self.written = 0
        self.buffer: np.ndarray | None = None
        self.filled = 0
        self.pending: deque[ray.ObjectRef[Any]] = deque()
        self.failed = False
        deferred.start()  # here, never from a finalizer

    def write(self, data: Any) -> int:
        self.check_writable()
        try:
            return self._write(memoryview(data).cast("B"))
        except BaseException as e:
            self._abort(e)  # now: the staging file may have a hole
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
        self.pending.append(self._submit(chunk, self.offset, chunk_checksum(chunk)))
        self.offset += len(chunk)
        if self.transfer is not None:
            self.transfer.advance(len(chunk))

    def _submit(self, chunk: np.ndarray, offset: int, checksum: str) -> ray.ObjectRef[Any]:
        """Start writing ``chunk`` at ``offset`` of the staging file (Ray copies it
        into the object store on submit: the caller may reuse its buffer)."""
        link = self.link
        return link.submit(
            NodeFiles.fs_write,
            link.root,
            self.staging,
            offset,
            chunk,
            checksum,
            link.config.direct_io,
        )

    def _commit(self, tail: Any, checksum: str, size: int) -> None:
        """Write the ``tail`` (the last, partial chunk) and publish the file."""
        link = self.link
        commit = Commit(
            self.local, self.staging, self.offset, tail, checksum, size,
            link.config.direct_io, self.expect,
        )  # fmt: skip
        link.call(NodeFiles.fs_commit, link.root, commit)

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
            self._commit(tail, chunk_checksum(tail), self.offset + self.filled)
        except BaseException as e:
            self._abort(e)
            raise
        finally:
            self.buffer = None
            super().close()
        if self.transfer is not None:
            self.transfer.advance(self.filled)
            self.transfer.finish()

    def _abort(self, error: BaseException) -> None:
        """Remove the staging file, once the chunk writes in flight are done (so that
        none fails unseen, and none lands after the removal)."""
        self.failed = True
        if self.transfer is not None:
            self.transfer.finish(error)
        pending, self.pending = list(self.pending), deque()
        _abort_upload(self.link, self.staging, pending)

    def __del__(self) -> None:
        if not self.closed:  # dropped unclosed: the upload did not finish
            self.failed = True
            pending, self.pending = list(self.pending), deque()
            link, staging, transfer = self.link, self.staging, self.transfer
            deferred.soon(lambda: _abort_upload(link, staging, pending, transfer))
            io.RawIOBase.close(self)  # not self.close(): that would commit
        super().__del__()


def _abort_upload(
    link: AgentLink,
    staging: str,
    pending: list[ray.ObjectRef[Any]],
    transfer: Transfer | None = None,
) -> None:
    if transfer is not None:  # an upload dropped unclosed: a failed one
        transfer.finish(dropped_error(staging))
    if not ray.is_initialized():  # Ray is gone (interpreter exit): so is the agent
        return
    for ref in pending:
        with contextlib.suppress(Exception):
            link.wait(ref)
    try:
        link.call(NodeFiles.fs_abort, link.root, staging)
    except Exception as e:  # the agent is gone: the file stays hidden, goes with its dir
        logger.warning("air-transfer: could not remove the staging file %s: %s", staging, e)
