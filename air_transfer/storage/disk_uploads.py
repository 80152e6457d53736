"""Node storage, the storage-node side: file bodies arriving in chunks.

Runs in the agent of the storage node (``NodeAgent.disk`` dispatches to these
methods). A write to ``path`` creates a hidden
staging file next to it; each chunk, checked against the checksum it was sent with,
is written at its offset (``os.pwrite``), so the agent's threads may write chunks in
any order; the commit checks the size and renames the staging file over ``path``.
Readers see the old file or the new one, never half of it. A staging file whose
writer died stays hidden from listings and goes with its directory. Plain Python.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import uuid
from typing import Any, ClassVar

from air_transfer.direct_io import pwrite_direct, should_write_direct
from air_transfer.errors import ChecksumError
from air_transfer.manifest import chunk_checksum
from air_transfer.storage.disk import STAGING_MARK, oserror, real_path


class DiskUploads:
    """The node-side half of writes through ``storage_filesystem``."""

    #: The operations the agent may run (``NodeAgent.disk``).
    OPS: ClassVar[frozenset[str]] = frozenset(
        {"fs_copy_file", "fs_open_write", "fs_write", "fs_commit", "fs_abort"}
    )

    def fs_copy_file(self, root: str, src: str, dest: str) -> None:
        src = real_path(root, src)
        if os.path.isdir(src):
            raise oserror(IsADirectoryError, errno.EISDIR, src, ": cannot copy a directory")
        staging, _ = self.fs_open_write(root, dest, append=False)
        try:
            shutil.copyfile(src, staging)
            os.replace(staging, dest)
        except BaseException:
            _discard(staging)
            raise

    def fs_open_write(self, root: str, path: str, append: bool) -> tuple[str, int]:
        """Create the staging file for a write to ``path``; returns it and the offset
        the new bytes start at (the current size when appending)."""
        path = real_path(root, path)
        if os.path.isdir(path):
            raise oserror(IsADirectoryError, errno.EISDIR, path, ": cannot write to it")
        parent, name = os.path.split(path)
        try:
            parent_st = os.stat(parent)
        except FileNotFoundError:
            raise oserror(FileNotFoundError, errno.ENOENT, path, " (parent directory)") from None
        except NotADirectoryError:
            raise oserror(NotADirectoryError, errno.ENOTDIR, path, " (in its parent)") from None
        if not stat.S_ISDIR(parent_st.st_mode):
            raise oserror(NotADirectoryError, errno.ENOTDIR, path, " (its parent is a file)")
        staging = os.path.join(parent, f".{name}{STAGING_MARK}{uuid.uuid4().hex}")
        os.close(os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return staging, 0
        os.chmod(staging, stat.S_IMODE(st.st_mode))
        if not append:
            return staging, 0
        shutil.copyfile(path, staging)
        return staging, st.st_size

    def fs_write(
        self,
        root: str,
        staging: str,
        offset: int,
        data: Any,
        checksum: str,
        direct_io: bool = False,
    ) -> None:
        """Write one chunk at ``offset`` of a staging file, after checking it; with
        ``direct_io``, a large block-aligned chunk goes around the page cache (as
        ``TransferConfig.direct_io`` has the writer of ``to_directory`` do)."""
        view = memoryview(data).cast("B")
        if chunk_checksum(view) != checksum:
            raise ChecksumError(
                f"a chunk of {len(view)} bytes for offset {offset} of {staging!r} arrived "
                "altered (checksum mismatch); the file is not written"
            )
        path = _staging(root, staging)
        if should_write_direct(len(view), direct_io) and pwrite_direct(path, view, offset):
            return
        fd = os.open(path, os.O_WRONLY)
        try:
            while view:
                n = os.pwrite(fd, view, offset)
                view, offset = view[n:], offset + n
        finally:
            os.close(fd)

    def fs_commit(
        self,
        root: str,
        path: str,
        staging: str,
        offset: int,
        tail: Any,
        checksum: str,
        size: int,
        direct_io: bool = False,
    ) -> None:
        """Write the last bytes, check the staging file holds ``size`` bytes, and
        rename it over ``path``; on any error the staging file is removed."""
        try:
            if len(memoryview(tail)):
                self.fs_write(root, staging, offset, tail, checksum, direct_io)
            written = os.stat(staging).st_size
            if written != size:
                raise OSError(
                    f"upload of {path!r} is incomplete: {written} of {size} bytes arrived"
                )
            os.replace(staging, real_path(root, path))
        except BaseException:
            _discard(staging)
            raise

    def fs_abort(self, root: str, staging: str) -> None:
        _discard(_staging(root, staging))


def _staging(root: str, staging: str) -> str:
    if STAGING_MARK not in os.path.basename(staging):
        raise PermissionError(f"{staging!r} is not a staging file of an upload")
    return real_path(root, staging)


def _discard(staging: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staging)
