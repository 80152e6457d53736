"""Node storage, the caller side when the caller runs on the storage node itself.

There the files are local: going through the agent and the object store would only
copy every byte twice more (a restore on the storage node took 3.5 s/GB that way,
against 0.5 s/GB for the disk itself). So reads hand pyarrow the file itself, a
native ``pyarrow.OSFile`` that its C++ copy loop reads without Python, and writes go
straight into the upload's staging file and are committed, both exactly as the agent
would do them (``confine``, ``disk_uploads``), from this process. The guarantees are
the same: every path confined to the root, an upload appears whole at ``close`` or
not at all.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import stat
import weakref
from typing import Any, BinaryIO

import pyarrow as pa

from air_transfer.cluster.agent_client import Expect
from air_transfer.config import TransferConfig
from air_transfer.core.checksum import chunk_checksum, chunk_hasher
from air_transfer.core.confine import Where, at, open_file, open_regular, oserror
from air_transfer.core.direct_io import DirectFileWriter
from air_transfer.observe import deferred
from air_transfer.observe.telemetry import (
    Transfer,
    dropped_error,
    finish_soon,
)
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.client.uploads import UploadStream
from air_transfer.storage.node_api import Commit, IndexedCommit, NodeFiles, NodeIndexedUploads

logger = logging.getLogger(__name__)

#: A writer reports its bytes to its ``Transfer`` at least this many at a time: a
#: caller may write a few bytes per call, metrics and bars want one update per chunk.
REPORT_BYTES = 8 << 20


def open_native(root: str, local: str) -> pa.NativeFile:
    """The file at node path ``local`` (confined to ``root``) as a native pyarrow
    file: opened once through the confined walk, then handed to pyarrow by its
    descriptor's ``/proc`` link (the same open file, no path lookup again)."""
    fd, _ = open_regular(root, local)
    try:
        return pa.OSFile(f"/proc/self/fd/{fd}", mode="r")
    finally:
        os.close(fd)


def open_staging(root: str, staging: str) -> int:
    """The staging file ``staging`` (confined to ``root``) opened for writing; it must
    be a regular file (not one swapped in since it was made)."""

    def open_it(w: Where) -> int:
        fd = open_file(w, os.O_RDWR)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise oserror(OSError, errno.EINVAL, staging, ": not a regular file")
        return fd

    return at(root, staging, open_it, follow=False)


class SameNodeWriter(UploadStream):
    """Writes an upload's bytes straight into its staging file (around the page
    cache with ``config.direct_io``) and commits it on ``close``; a failed write or
    a writer dropped unclosed removes the staging file instead.

    With ``config.incremental`` (a write from offset 0) it also hashes the bytes per
    file chunk as they pass, and commits with those checksums (``fs_commit_indexed``):
    a file whose every byte a stored one holds (a DCP shard unchanged since an earlier
    save) becomes a hard link of it, one copy on disk, and the file serves later
    saves, as an upload from another node does. Nothing travels either way."""

    def __init__(
        self,
        link: AgentLink,
        local: str,
        staging: str,
        start: int,
        expect: Expect,
        config: TransferConfig,
        transfer: Transfer | None = None,
    ) -> None:
        super().__init__()
        root = link.root
        self.link, self.root, self.local, self.staging = link, root, local, staging
        self.start, self.expect, self.config = start, expect, config
        self.transfer = transfer  # the upload's metrics and bar
        deferred.start()  # here, never from __del__
        self.written = 0
        self._unreported = 0
        self.failed = False
        #: Each full per-file chunk's checksum so far (incremental only, else None),
        #: and the hash of the chunk being written (``_hashed`` bytes of it).
        self.sums: list[str] | None = [] if config.incremental and start == 0 else None
        self._hasher = chunk_hasher()
        self._hashed = 0
        self._file: DirectFileWriter | BinaryIO
        # The staging file again, as created: through the confined walk, never by its
        # path (a directory on the way swapped for a symlink would lead out of root).
        try:
            fd = open_staging(root, staging)
            if config.direct_io and start == 0:
                self._file = DirectFileWriter(staging, fd=fd)
            else:
                self._file = open(fd, "r+b", buffering=0)
                self._file.seek(start)
        except BaseException as e:  # nothing to write into: the upload ends here
            _abort(link, staging)
            if transfer is not None:
                transfer.finish(e)
            io.RawIOBase.close(self)  # so that __del__ has nothing to discard
            raise
        # Dropped unclosed (pyarrow's copy_files does so when its source fails), the
        # upload did not finish: remove it, never commit it.
        self._discard = weakref.finalize(self, _discard, link, staging, self._file)

    def write(self, data: Any) -> int:
        self.check_writable()
        view = memoryview(data).cast("B")
        try:
            if isinstance(self._file, DirectFileWriter):
                self._file.write(view)
            else:
                remaining = view
                while remaining:
                    remaining = remaining[self._file.write(remaining) or 0 :]
        except BaseException as e:
            self.failed = True
            self._discard()
            if self.transfer is not None:
                self.transfer.finish(e)
            raise
        if self.sums is not None:
            self._hash(view)
        self.written += len(view)
        self._unreported += len(view)
        if self.transfer is not None and self._unreported >= REPORT_BYTES:
            self.transfer.advance(self._unreported)
            self._unreported = 0
        return len(view)

    def _hash(self, view: memoryview) -> None:
        """Feed ``view`` (just written) to the per-chunk hashes, cut every
        ``chunk_bytes`` from the file's offset 0 (``core.file_chunks``)."""
        chunk_bytes = self.config.chunk_bytes
        while view:
            take = min(chunk_bytes - self._hashed, len(view))
            self._hasher.update(view[:take])
            self._hashed += take
            view = view[take:]
            if self._hashed == chunk_bytes:
                assert self.sums is not None
                self.sums.append(self._hasher.hexdigest())
                self._hasher.reset()
                self._hashed = 0

    def close(self) -> None:
        """Commit the file: it appears whole, or (after a failed write) not at all."""
        if self.closed:
            return
        try:
            if self.failed:
                return
            self._file.close()
            self._commit(self.start + self.written)
            self._discard.detach()
        except BaseException as e:
            self._discard()
            if self.transfer is not None:
                self.transfer.finish(e)
            raise
        finally:
            super().close()
        if self.transfer is not None:
            self.transfer.advance(self._unreported)
            self.transfer.finish()

    def _commit(self, size: int) -> None:
        """Have the agent rename the staging file over the target (commits of one
        storage are serialized there, whichever node wrote the bytes)."""
        # Every byte is in the staging file already: the commit has no tail to write.
        whole = (self.local, self.staging, size, b"", chunk_checksum(b""), size)
        direct_io, expect = self.config.direct_io, self.expect
        if self.sums is None:
            self.link.call(NodeFiles.fs_commit, self.root, Commit(*whole, direct_io, expect))
            return
        sums = (*self.sums, self._hasher.hexdigest()) if self._hashed else tuple(self.sums)
        indexed = IndexedCommit(
            *whole, direct_io, expect, sums=sums, chunk_bytes=self.config.chunk_bytes
        )
        self.link.call(NodeIndexedUploads.fs_commit_indexed, self.root, indexed)

    def __del__(self) -> None:
        if not self.closed:  # dropped unclosed: not self.close(), that would commit
            self._discard()
            if self.transfer is not None:
                finish_soon(self.transfer, dropped_error(self.local))
            io.RawIOBase.close(self)
        super().__del__()


def _discard(link: AgentLink, staging: str, file: DirectFileWriter | BinaryIO) -> None:
    """Close ``file`` and have the agent remove its staging file (a finalizer may run
    this inside a garbage collection: the agent call then waits for ``deferred``)."""
    with contextlib.suppress(Exception):
        if isinstance(file, DirectFileWriter):
            file.abort()
        else:
            file.close()
    deferred.soon(lambda: _abort(link, staging))


def _abort(link: AgentLink, staging: str) -> None:
    """Remove the staging file ``staging`` through the storage node's agent; an agent
    gone meanwhile leaves it hidden (``air-transfer clean`` removes it)."""
    try:
        link.call(NodeFiles.fs_abort, link.root, staging)
    except (OSError, ConnectionError) as e:
        logger.warning("air-transfer: could not remove the staging file %s: %s", staging, e)
