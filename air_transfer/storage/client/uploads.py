"""Node storage, the wire: writes. ``NodeUpload`` is every file written to node
storage; its ``Mode`` says where the bytes go and its ``Staged`` copies how many
staging files take them, so cutting, the window, checksums, progress and the
guarantees below are written once:

- ``Route.HERE``: the caller runs on the storage node, so the bytes go straight into
  the staging file (around the page cache with ``direct_io``): through the agent and
  the object store every byte would be copied twice more.
- ``Route.SEND``: ``chunk_bytes`` chunks, each sent with its checksum to the agent of
  every copy, at most ``window`` unacknowledged per copy; a chunk for several copies
  (``replica_write.ReplicaWrite``, the replica registry's ``CopyRules``) is put once and
  every copy writes it from that one object.
- ``Route.OFFER`` (``TransferConfig(incremental=True)``: checksums first): each chunk
  is put in this node's store and the storage node, asked with its checksum, copies a
  proven stored copy from its own disk or fetches it (``fs_write_or_reuse``); a tail
  of a quarter chunk or more is asked about too, a smaller one travels with the commit.

Chunks are cut every ``chunk_bytes`` from offset 0 of the file (``core.file_chunks``),
so an unchanged region is the same chunk in every save; an indexed upload commits
with every file chunk's checksum, so the file can serve later saves.

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
import functools
import io
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO, cast

import numpy as np
import ray

from air_transfer.cluster.refs import ChunkRef
from air_transfer.config import TransferConfig
from air_transfer.core.checksum import chunk_checksum, chunk_hasher
from air_transfer.core.direct_io import DirectFileWriter
from air_transfer.observe import deferred
from air_transfer.observe.telemetry import Transfer, dropped_error
from air_transfer.storage.client.replica_set import full
from air_transfer.storage.client.same_node import open_staging
from air_transfer.storage.client.upload_copies import (
    CopyRules,
    Mode,
    Pending,
    Route,
    Staged,
    abort_copy,
)
from air_transfer.storage.node_api import (
    ChunkAt,
    Commit,
    IndexedCommit,
    NodeFiles,
    NodeIndexedUploads,
)

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

logger = logging.getLogger(__name__)

#: A ``Route.HERE`` writer reports its bytes to its ``Transfer`` at least this many at
#: a time: a caller may write a few bytes per call, metrics and bars want one update
#: per chunk.
REPORT_BYTES = 8 << 20


class WriteStream(io.RawIOBase):
    """A write-only stream of one file, as node storage's uploads are: ``tell`` is
    what was written, and once a write failed (the file is then not stored) every
    later write fails too, so a caller that ignored the first error cannot end up
    storing a file with a hole."""

    written: int
    failed: bool

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.written

    def _next_write(self, data: Buffer, name: str) -> memoryview:
        """``data`` as bytes to write to file ``name``, if this stream takes more."""
        if self.closed:
            raise ValueError(f"write to closed file {name!r}")
        if self.failed:
            raise OSError(errno.EIO, "an earlier write failed; the file is not stored", name)
        return memoryview(data).cast("B")


class NodeUpload(WriteStream):
    """One file written to node storage as ``mode`` says, to ``copies``; ``close``
    commits it, anything else (a failed write, being dropped unclosed) aborts it.
    ``name`` is the path that messages name."""

    def __init__(
        self,
        mode: Mode,
        copies: list[Staged],
        config: TransferConfig,
        name: str,
        transfer: Transfer | None = None,  # the upload's metrics and bar
        rules: CopyRules | None = None,
    ) -> None:
        super().__init__()
        self.mode, self.copies, self.name, self.transfer, self.rules = (
            mode, copies, name, transfer, rules,
        )  # fmt: skip
        self.chunk_bytes, self.window = config.chunk_bytes, config.window
        self.written = 0  # taken from the caller
        self.sent = 0  # in the staging files, or on their way there
        self.failed = False
        self.buffer: np.ndarray | None = None  # the chunk being filled
        self.sums: list[str] | None = [] if mode.indexed else None  # each file chunk's
        self.hasher = chunk_hasher()  # HERE: the file chunk being written
        self.unreported = 0
        self.batch = REPORT_BYTES if mode.route is Route.HERE else 0
        self.share = mode.route is Route.OFFER or len(copies) > 1  # chunks put once
        self.file: DirectFileWriter | BinaryIO | None = None
        deferred.start()  # here, never from a finalizer
        if mode.indexed and any(s.start for s in copies):
            raise ValueError("an incremental upload starts at offset 0 of its file")
        if mode.route is Route.HERE:
            self._open_here()

    def _open_here(self) -> None:
        """The staging file again, as created: through the confined walk, never by its
        path (a directory on the way swapped for a symlink would lead out of root)."""
        [s] = self.copies
        try:
            fd = open_staging(s.link.root, s.staging)
            if self.mode.direct_io and s.start == 0:
                self.file = DirectFileWriter(s.staging, fd=fd)
            else:
                self.file = open(fd, "r+b", buffering=0)
                self.file.seek(s.start)
        except BaseException as e:  # nothing to write into: the upload ends here
            self._abort(e)
            io.RawIOBase.close(self)  # so that __del__ has nothing to discard
            raise

    def write(self, data: Buffer) -> int:
        view = self._next_write(data, self.name)
        try:
            if self.mode.route is Route.HERE:
                self._write_here(view)
            else:
                self._cut(view)
        except BaseException as e:
            self._abort(e)  # now: the staging file may have a hole
            raise
        return len(view)

    def _pieces(self, view: memoryview) -> Iterator[tuple[memoryview, bool]]:
        """``view`` cut where chunks end (every ``chunk_bytes`` from where the upload
        starts): each piece, taken, and whether it ends a chunk."""
        cb = self.chunk_bytes
        while view:
            take = min(cb - self.written % cb, len(view))
            piece, view = view[:take], view[take:]
            self.written += take
            yield piece, self.written % cb == 0

    def _write_here(self, view: memoryview) -> None:
        if isinstance(self.file, DirectFileWriter):
            self.file.write(view)
        else:
            assert self.file is not None
            rest = view
            while rest:
                rest = rest[self.file.write(rest) or 0 :]
        for piece, ends in self._pieces(view):
            if self.sums is not None:  # hashed as they pass, per file chunk
                self.hasher.update(piece)
                if ends:
                    self.sums.append(self.hasher.hexdigest())
                    self.hasher.reset()
        self.sent += len(view)
        self._report(len(view))

    def _cut(self, view: memoryview) -> None:
        cb = self.chunk_bytes
        for piece, ends in self._pieces(view):
            if len(piece) == cb:  # a whole chunk of the caller's: no copy here
                self._send(np.frombuffer(piece, dtype=np.uint8))
                continue
            if self.buffer is None:
                self.buffer = np.empty(cb, dtype=np.uint8)
            filled = self.written - self.sent
            self.buffer[filled - len(piece) : filled] = piece
            if ends:
                self._send(self.buffer)  # Ray copies it into the store on submit (or put)

    def _send(self, chunk: np.ndarray) -> None:
        """Have every copy still in the write write ``chunk``."""
        checksum, body = chunk_checksum(chunk), None
        for s in self._live():
            try:
                while len(s.pending) >= self.window:
                    s.link.wait(s.pending.popleft())
                if body is None:
                    body = ray.put(chunk) if self.share else chunk
                s.pending.append(self._submit(s, body, len(chunk), checksum))
            except Exception as e:
                if self.rules is None or not self.rules.can_lose(s, e):
                    raise
                s.error = e
        if self.sums is not None:
            self.sums.append(checksum)
        self.sent += len(chunk)
        self._report(len(chunk))

    def _submit(
        self, s: Staged, body: np.ndarray | ChunkRef, length: int, checksum: str
    ) -> Pending:
        """Start writing ``body`` (a chunk, or its ref) at its offset of ``s``'s
        staging file; offered, the ref goes in a list, which Ray does not resolve."""
        root, into = s.link.root, ChunkAt(s.staging, s.start + self.sent, self.mode.direct_io)
        if self.mode.route is Route.OFFER:  # put already (``share``): the ref is offered
            sent = [cast(ChunkRef, body)]
            return s.link.submit(
                NodeIndexedUploads.fs_write_or_reuse, root, into, checksum, length, sent
            )
        return s.link.submit(NodeFiles.fs_write, root, into, body, checksum)

    def _live(self) -> list[Staged]:
        live = [s for s in self.copies if s.error is None]
        if not live:
            filled = [s.error for s in self.copies if full(s.error)]
            if filled and filled[0] is not None:  # no copy had room: as on one disk
                raise filled[0]
            raise ConnectionError(f"every copy of {self.name!r} was lost while it was written")
        return live

    def _report(self, nbytes: int) -> None:
        self.unreported += nbytes
        if self.transfer is not None and self.unreported >= self.batch:
            self.transfer.advance(self.unreported)
            self.unreported = 0

    def close(self) -> None:
        """Commit the file: it appears whole, or (after a failed write) not at all."""
        if self.closed:
            return
        try:
            if self.failed:
                return  # aborted when the write failed
            self._commit()
        except BaseException as e:
            self._abort(e)
            raise
        finally:
            self.buffer = None
            super().close()
        if self.transfer is not None:
            self.transfer.advance(self.unreported)
            self.transfer.finish()

    def _commit(self) -> None:
        if self.file is not None:
            self.file.close()  # every byte is in the staging file: the commit has no tail
        tail = self.buffer[: self.written - self.sent] if self.buffer is not None else b""
        checksum = chunk_checksum(tail)
        if self.sums is not None and self.written % self.chunk_bytes:  # the last chunk
            here = self.mode.route is Route.HERE
            self.sums.append(self.hasher.hexdigest() if here else checksum)
        offer = self.mode.route is Route.OFFER and 4 * len(tail) >= self.chunk_bytes
        self.unreported += len(tail)
        commit = functools.partial(self._commit_copy, tail=tail, checksum=checksum, offer=offer)
        if self.rules is None:
            [s] = self.copies
            commit(s, "")
        else:
            self.rules.commit(self.copies, commit)
        self.copies = []

    def _commit_copy(
        self, s: Staged, op: str, tail: np.ndarray | bytes, checksum: str, offer: bool
    ) -> None:
        """Publish the file on copy ``s`` once its chunk writes are done, its ``tail``
        (the last, partial chunk) written by the commit or, ``offer``, before it as a
        full chunk is."""
        while s.pending:
            s.link.wait(s.pending.popleft())
        sent = self.sent
        if offer:
            s.link.wait(self._submit(s, ray.put(np.asarray(tail)), len(tail), checksum))
            sent, tail, checksum = sent + len(tail), b"", chunk_checksum(b"")
        whole = (s.path, s.staging, s.start + sent, tail, checksum, s.start + self.written)
        root, direct_io = s.link.root, self.mode.direct_io
        if self.sums is None:
            s.link.call(NodeFiles.fs_commit, root, Commit(*whole, direct_io, s.expect), op)
            return
        sums, cb = tuple(self.sums), self.chunk_bytes
        indexed = IndexedCommit(*whole, direct_io, s.expect, sums=sums, chunk_bytes=cb)
        s.link.call(NodeIndexedUploads.fs_commit_indexed, root, indexed)

    def abort(self, error: BaseException) -> None:
        """Give the upload up unclosed: every staging file removed, nothing committed."""
        if not self.closed:
            self._abort(error)
            io.RawIOBase.close(self)

    def _abort(self, error: BaseException) -> None:
        """Remove every staging file (``abort_copy``)."""
        self.failed = True
        if self.transfer is not None:
            self.transfer.finish(error)
        copies, self.copies = self.copies, []
        _close(self.file)
        for s in copies:
            abort_copy(s)

    def __del__(self) -> None:
        if not self.closed:  # dropped unclosed: the upload did not finish
            self.failed = True
            copies, self.copies, transfer = self.copies, [], self.transfer
            error = dropped_error(self.name)
            _close(self.file)
            deferred.soon(lambda: _dropped(copies, transfer, error))
            io.RawIOBase.close(self)  # not self.close(): that would commit
        super().__del__()


def _close(file: DirectFileWriter | BinaryIO | None) -> None:
    with contextlib.suppress(Exception):
        if isinstance(file, DirectFileWriter):
            file.abort()
        elif file is not None:
            file.close()


def _dropped(copies: list[Staged], transfer: Transfer | None, error: OSError) -> None:
    if transfer is not None:  # an upload dropped unclosed: a failed one
        transfer.finish(error)
    for s in copies:
        abort_copy(s)
