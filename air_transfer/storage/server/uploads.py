"""Node storage, the storage-node side: file bodies arriving in chunks.

Runs in the agent of the storage node, which serves ``DiskUploads`` behind
``node_api.NodeFiles`` (``node_service.NodeStorageService.services``). A write to
``path`` creates a hidden staging file next to it; each chunk, checked against the
checksum it was sent with, is written at its offset (``os.pwrite``), so the agent's
threads may write chunks in any order; the commit checks the size and renames the
staging file over ``path``. Readers see the old file or the new one, never half of
it. A staging file stays hidden from listings; one whose writer died is removed once
that is known (``upload_writers``).

Concurrent writes to one path: each has its own staging file and the last commit
wins, whole. An append copies the file as it is when the append opens; if another
commit replaced the file before this one commits, this one fails (``ESTALE``) rather
than silently dropping the other writer's bytes (``LocalFileSystem`` appends in place,
so there both land). Every path, staging paths included, is confined to the root by
``confine.at``; a staging path must name a staging file. Plain Python.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import stat
import sys
import threading
from typing import TYPE_CHECKING, cast

from air_transfer.cluster.refs import ChunkRef
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.confine import (
    Raced,
    Where,
    at,
    checked_path,
    is_symlink,
    open_file,
    open_regular,
    oserror,
)
from air_transfer.core.direct_io import pwrite_direct, should_write_direct
from air_transfer.core.placed_mark import mark_root, mark_stub
from air_transfer.core.process_locks import Process
from air_transfer.core.reuse import link_at
from air_transfer.errors import ChecksumError
from air_transfer.storage.node_api import ChunkAt, Commit, NodeFiles
from air_transfer.storage.node_wire import Expect
from air_transfer.storage.server.stub_swap import swap_stub
from air_transfer.storage.server.tree import STAGING_MARK, hidden_name
from air_transfer.storage.server.upload_writers import UploadWriters

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


class DiskUploads(NodeFiles):
    """The node-side half of writes through ``storage_filesystem``."""

    def __init__(self, writers: UploadWriters[Process] | None = None) -> None:
        # An append's check that its file is unchanged, and its rename, must not let
        # another commit in between (every commit of this storage runs in this agent).
        self._publishing = threading.Lock()
        #: Who writes each upload in progress (None: nobody watches the writers).
        self.writers = writers

    def fs_copy_file(self, root: str, src: str, dest: str, op: str = "") -> None:
        source, _ = open_regular(root, src, "copy")
        try:
            staging, _, _ = self.fs_open_write(root, dest, append=False)
            try:
                at(root, staging, lambda w: _copy_into(w, source), follow=False)
                self._publish(root, dest, staging, None, None)
            except BaseException:
                with contextlib.suppress(OSError):
                    self.fs_abort(root, staging)
                raise
        finally:
            os.close(source)

    def fs_open_write(
        self, root: str, path: str, append: bool, writer: Process | None = None
    ) -> tuple[str, int, Expect]:
        """Create the staging file for a write to ``path``; returns it, the offset the
        new bytes start at (the size of the file copied when appending), and what the
        commit expects to find at ``path``. ``writer``: the process that writes it,
        whose death discards the upload (``upload_writers``)."""

        def stage(w: Where) -> tuple[str, int, Expect]:
            try:
                st: os.stat_result | None = os.stat(w.name, dir_fd=w.fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and is_symlink(st):
                raise Raced  # the resolution found none: it changed meanwhile
            if st is not None and stat.S_ISDIR(st.st_mode):
                raise oserror(IsADirectoryError, errno.EISDIR, w.name, ": cannot write to it")
            name = hidden_name(w.name, STAGING_MARK)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            out = os.open(name, flags, 0o666, dir_fd=w.fd)
            try:
                start, expect = _take_over(w, out, append)
                return posixpath.join(posixpath.dirname(w.real), name), start, expect
            except BaseException:
                os.unlink(name, dir_fd=w.fd)
                raise
            finally:
                os.close(out)

        staging, start, expect = at(root, path, stage)
        if self.writers is not None:
            self.writers.begin(root, staging, writer)
        return staging, start, expect

    def fs_write(self, root: str, into: ChunkAt, data: Buffer | ChunkRef, checksum: str) -> None:
        """Write one chunk where ``into`` says, after checking it; with ``direct_io``, a
        large block-aligned chunk goes around the page cache (as
        ``TransferConfig.direct_io`` has the writer of ``to_directory`` do)."""
        view = memoryview(cast("Buffer", data)).cast("B")  # a ref arrives resolved by Ray
        if chunk_checksum(view) != checksum:
            raise ChecksumError(
                errno.EIO,
                f"a chunk of {len(view)} bytes for offset {into.offset} arrived altered "
                "(checksum mismatch); the file is not written",
                into.staging,
            )
        self.write_proven(root, into, view)

    def write_proven(self, root: str, into: ChunkAt, view: memoryview) -> None:
        """``fs_write`` of a chunk this agent has just proven against its checksum
        itself (read from a stored copy and hashed): hashing it again would cost a
        pass over its bytes for nothing. No caller elsewhere reaches it: the agent
        hosts the node storage service, not this class (``cluster.rpc.Services``)."""
        staging, offset = into.staging, into.offset
        _require_staging(staging)

        def write(w: Where) -> None:
            fd = open_file(w, os.O_WRONLY)
            try:
                if should_write_direct(len(view), into.direct_io) and _pwrite_direct(
                    fd, view, offset
                ):
                    return
                done = 0
                while done < len(view):
                    done += os.pwrite(fd, view[done:], offset + done)
            finally:
                os.close(fd)

        at(root, staging, write, follow=False)

    def fs_commit(self, root: str, commit: Commit, op: str = "") -> None:
        """Write the last bytes, check the staging file holds ``commit.size`` bytes,
        and rename it over ``commit.path``; on any error the staging file is removed."""
        c = commit
        _require_staging(c.staging)  # before anything, the clean-up included
        checked_path(root, c.path)  # and a refused path before any byte is written
        try:
            if len(memoryview(c.tail)):
                self.fs_write(root, ChunkAt(c.staging, c.offset, c.direct_io), c.tail, c.checksum)
            self._publish(root, c.path, c.staging, c.size, c.expect, c.placed is True)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs_abort(root, c.staging)
            raise

    def fs_swap_stub(self, root: str, path: str, expect: bytes, head: bytes, op: str = "") -> None:
        swap_stub(root, path, expect, head, self._publishing)

    def fs_link_staging(self, root: str, staging: str, source: int) -> bool:
        """Make a staging file a hard link of the open stored file ``source``, which
        holds the same bytes (proven by the caller): one copy on disk for both. False,
        the staging file kept as it is, where the modes differ or the filesystem
        refuses the link."""
        _require_staging(staging)

        def relink(w: Where) -> bool:
            mode = os.stat(w.name, dir_fd=w.fd, follow_symlinks=False).st_mode
            if stat.S_IMODE(os.fstat(source).st_mode) != stat.S_IMODE(mode):
                return False
            link = hidden_name(w.name, STAGING_MARK)
            if not link_at(source, w.fd, link):
                return False
            try:
                os.rename(link, w.name, src_dir_fd=w.fd, dst_dir_fd=w.fd)
            except BaseException:
                os.unlink(link, dir_fd=w.fd)
                raise
            return True

        return bool(at(root, staging, relink, follow=False))

    def fs_abort(self, root: str, staging: str) -> None:
        _require_staging(staging)

        def discard(w: Where) -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(w.name, dir_fd=w.fd)

        try:
            at(root, staging, discard, follow=False)
        finally:
            if self.writers is not None:
                self.writers.end(staging)

    def _publish(
        self,
        root: str,
        path: str,
        staging: str,
        size: int | None,
        expect: Expect,
        placed: bool = False,
    ) -> None:
        """Rename ``staging`` over ``path`` (it must hold ``size`` bytes, if given;
        marked a placed file's stub first if ``placed``: ``core.placed_mark``)."""

        def publish(s: Where) -> None:
            if size is not None or placed:
                fd = open_file(s, os.O_RDONLY)
                try:
                    written = os.fstat(fd).st_size
                    if placed:
                        mark_stub(fd, path)
                        mark_root(root)
                finally:
                    os.close(fd)
                if size is not None and written != size:
                    detail = f": upload incomplete: {written} of {size} bytes arrived"
                    raise oserror(OSError, errno.EIO, path, detail)

            def replace(d: Where) -> None:
                with self._publishing:
                    if expect is not None and _found(d) != expect:
                        detail = (
                            " (it changed since this append began: another write was "
                            "committed first; nothing was stored, append again)"
                        )
                        raise oserror(OSError, errno.ESTALE, path, detail)
                    os.rename(s.name, d.name, src_dir_fd=s.fd, dst_dir_fd=d.fd)

            at(root, path, replace)

        at(root, staging, publish, follow=False)
        if self.writers is not None:
            self.writers.end(staging)


def _require_staging(staging: str) -> None:
    if not isinstance(staging, str) or STAGING_MARK not in posixpath.basename(staging):
        raise PermissionError(errno.EACCES, "not a staging file of an upload; refused", staging)


def _take_over(w: Where, out: int, append: bool) -> tuple[int, Expect]:
    """Give the staging file ``out`` the mode of the file at ``w`` (and its bytes, when
    appending); the offset new bytes start at, and what the commit expects there."""
    try:
        fd = open_file(w, os.O_RDONLY)
    except FileNotFoundError:  # none (or deleted meanwhile): a new file
        return 0, (() if append else None)
    try:
        st = os.fstat(fd)
        os.fchmod(out, stat.S_IMODE(st.st_mode))
        if not append:
            return 0, None
        if not stat.S_ISREG(st.st_mode):  # a FIFO, a device: nothing to copy
            return 0, _stamp(st)
        with open(fd, "rb", closefd=False) as i, open(out, "wb", closefd=False) as o:
            shutil.copyfileobj(i, o, 8 << 20)
        # What was copied, not the size seen before: the file may have grown since.
        return os.fstat(out).st_size, _stamp(os.fstat(fd))
    finally:
        os.close(fd)


def _copy_into(w: Where, source: int) -> None:
    out = open_file(w, os.O_WRONLY)
    try:
        with open(source, "rb", closefd=False) as i, open(out, "wb", closefd=False) as o:
            shutil.copyfileobj(i, o, 8 << 20)
    finally:
        os.close(out)


def _found(w: Where) -> tuple[int, ...]:
    try:
        return _stamp(os.stat(w.name, dir_fd=w.fd, follow_symlinks=False))
    except FileNotFoundError:
        return ()


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _pwrite_direct(fd: int, view: memoryview, offset: int) -> bool:
    """``pwrite_direct`` on the staging file already opened (confined) as ``fd``: it
    opens a path, so it is given the fd's own, which no rename can redirect. Only
    Linux has ``O_DIRECT``, and ``/proc``."""
    proc = f"/proc/self/fd/{fd}"
    return sys.platform == "linux" and os.path.exists(proc) and pwrite_direct(proc, view, offset)
