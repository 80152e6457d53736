"""Node storage, the caller side when the caller runs on the storage node itself.

There the files are local: going through the agent and the object store would only
copy every byte twice more (a restore on the storage node took 3.5 s/GB that way,
against 0.5 s/GB for the disk itself). So reads hand pyarrow the file itself, a
native ``pyarrow.OSFile`` that its C++ copy loop reads without Python, and writes go
straight into the upload's staging file (``upload_copies.Route.HERE``), both opened as the
agent would open them (``confine``), from this process: every path confined to the
root.
"""

from __future__ import annotations

import errno
import os
import stat

import pyarrow as pa

from air_transfer.core.confine import Where, at, open_file, open_regular, oserror


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
