"""Node storage with ``placement="writer"``, the storage-node side: a placed file's
stub given a new record in one step (``NodeFiles.fs_swap_stub``), for the repair of
its holders after one is lost.

The new stub is made beside the old (sparse, of its size, the new record in its
first bytes, marked: ``core.placed_mark``) and renamed over it only if the file is
still the stub the caller read: a marked stub beginning with the record it
expects, checked under the lock every commit of this storage takes (so no write of
the path lands between the check and the rename). Otherwise OSError (ESTALE): the
file was written, moved or deleted meanwhile, and nothing changed. Plain Python.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading

from air_transfer.core.confine import Where, at, open_file, oserror
from air_transfer.core.placed_mark import is_stub, mark_stub
from air_transfer.storage.server.tree import STAGING_MARK, hidden_name


def swap_stub(root: str, path: str, expect: bytes, head: bytes, publishing: threading.Lock) -> None:
    """Replace the record ``expect`` that stub ``path`` (under ``root``) begins with
    by ``head``, the file's size and mark kept; ESTALE if it is not that stub now."""
    if not expect or not head:
        raise oserror(OSError, errno.EINVAL, path, ": a stub's record cannot be empty")

    def swap(w: Where) -> None:
        with publishing:
            fd = open_file(w, os.O_RDONLY)
            try:
                st = os.fstat(fd)
                same = is_stub(fd) and os.pread(fd, len(expect), 0) == expect
            finally:
                os.close(fd)
            if not same or len(head) >= st.st_size:
                detail = ": it is no longer the placed file whose holders were repaired"
                raise oserror(OSError, errno.ESTALE, path, detail)
            name = hidden_name(w.name, STAGING_MARK)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            out = os.open(name, flags, st.st_mode & 0o7777, dir_fd=w.fd)
            try:
                try:
                    os.ftruncate(out, st.st_size)
                    os.pwrite(out, head, 0)
                    mark_stub(out, path)
                finally:
                    os.close(out)
                os.rename(name, w.name, src_dir_fd=w.fd, dst_dir_fd=w.fd)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=w.fd)
                raise

    at(root, path, swap)
