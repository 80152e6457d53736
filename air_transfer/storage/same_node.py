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
import io
import os
import weakref
from collections.abc import Callable
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.fs as pafs

from air_transfer.config import TransferConfig
from air_transfer.direct_io import DirectFileWriter
from air_transfer.layout import Source, scan
from air_transfer.manifest import Manifest, chunk_checksum
from air_transfer.metrics import Phase
from air_transfer.packing import read_chunks_ahead
from air_transfer.storage.chunk_writer import UploadStream
from air_transfer.storage.confine import open_regular
from air_transfer.storage.disk_uploads import DiskUploads, Expect
from air_transfer.telemetry import (
    NODE_STORAGE,
    Transfer,
    describe,
    dropped_error,
    finish_soon,
    start_finisher,
)
from air_transfer.writer import checked_chunks, write_tree

#: A writer reports its bytes to its ``Transfer`` at least this many at a time: a
#: caller may write a few bytes per call, metrics and bars want one update per chunk.
REPORT_BYTES = 8 << 20


def open_native(root: str, local: str) -> Any:
    """The file at node path ``local`` (confined to ``root``) as a native pyarrow
    file: opened once through the confined walk, then handed to pyarrow by its
    descriptor's ``/proc`` link (the same open file, no path lookup again)."""
    fd, _ = open_regular(root, local)
    try:
        return pa.OSFile(f"/proc/self/fd/{fd}", mode="r")
    finally:
        os.close(fd)


class SameNodeWriter(UploadStream):
    """Writes an upload's bytes straight into its staging file (around the page
    cache with ``config.direct_io``) and commits it on ``close``; a failed write or
    a writer dropped unclosed removes the staging file instead."""

    def __init__(
        self,
        root: str,
        local: str,
        staging: str,
        start: int,
        expect: Expect,
        config: TransferConfig,
        transfer: Transfer | None = None,
    ) -> None:
        super().__init__()
        self.root, self.local, self.staging = root, local, staging
        self.start, self.expect, self.config = start, expect, config
        self.transfer = transfer  # the upload's metrics and bar
        if transfer is not None:
            start_finisher()  # here, never from __del__
        self.written = 0
        self._unreported = 0
        self.failed = False
        self._file: DirectFileWriter | BinaryIO
        if config.direct_io and start == 0:
            self._file = DirectFileWriter(staging)
        else:
            self._file = open(staging, "r+b", buffering=0)
            self._file.seek(start)
        # Dropped unclosed (pyarrow's copy_files does so when its source fails), the
        # upload did not finish: remove it, never commit it.
        self._discard = weakref.finalize(self, _discard, root, staging, self._file)

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
        self.written += len(view)
        self._unreported += len(view)
        if self.transfer is not None and self._unreported >= REPORT_BYTES:
            self.transfer.advance(self._unreported)
            self._unreported = 0
        return len(view)

    def close(self) -> None:
        """Commit the file: it appears whole, or (after a failed write) not at all."""
        if self.closed:
            return
        try:
            if self.failed:
                return
            self._file.close()
            size = self.start + self.written
            DiskUploads().fs_commit(
                self.root,
                self.local,
                self.staging,
                size,
                b"",
                chunk_checksum(b""),
                size,
                self.config.direct_io,
                self.expect,
            )
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

    def __del__(self) -> None:
        if not self.closed:  # dropped unclosed: not self.close(), that would commit
            self._discard()
            if self.transfer is not None:
                finish_soon(self.transfer, dropped_error(self.local))
            io.RawIOBase.close(self)
        super().__del__()


def _discard(root: str, staging: str, file: DirectFileWriter | BinaryIO) -> None:
    with contextlib.suppress(Exception):
        if isinstance(file, DirectFileWriter):
            file.abort()
        else:
            file.close()
    with contextlib.suppress(OSError):
        DiskUploads().fs_abort(root, staging)


def copy_tree(
    source: str,
    target: str,
    config: TransferConfig,
    phase: Phase = "download",
    check: Callable[[], None] | None = None,
) -> str:
    """Copy the checkpoint directory ``source`` to ``target`` on this node, as a
    transfer would write it: every byte read between checks of its file against the
    scan (a file changed meanwhile is a SourceChangedError), large files written
    around the page cache, the target published whole (merged into an existing
    directory in one step). For Ray Train's uploads and downloads on the storage node:
    the bytes never leave this process, so there is no object store to cross and no
    checksum to take. Counted as a transfer of ``phase`` (``upload`` for a report,
    ``download`` for a restore) of node storage. ``check`` is called before each
    chunk; what it raises ends the copy, nothing published."""
    src = Source(pafs.LocalFileSystem(), source)
    scanned = scan(src, follow_symlinks=config.follow_symlinks)
    manifest = Manifest(scanned.entries, config.chunk_bytes, None)
    transfer = Transfer(
        phase,
        strategy=NODE_STORAGE,
        total=manifest.total_bytes,
        desc=describe(target if phase == "download" else source, "copy"),
        progress=config.progress,
    )
    with transfer:
        chunks = read_chunks_ahead(
            src, scanned.files, scanned.stamps, config.chunk_bytes, checksums=False
        )
        views = transfer.chunks(
            (view for _, view, _ in chunks), manifest.chunk_length, verified=False
        )
        try:
            return write_tree(
                manifest,
                checked_chunks(views, check),
                target,
                verify=False,
                direct_io=config.direct_io,
            )
        finally:
            views.close()
            chunks.close()  # type: ignore[attr-defined]
