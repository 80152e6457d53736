"""Node storage with ``placement="writer"``: what marks a *stub*, a stored file whose
bytes live on other nodes (its holders) and whose own bytes are only a record of
where, followed by zeros.

The mark is an extended attribute the storage node's agent sets on the file when it
commits a stub (``node_api.Commit.placed``), never bytes of the file: no file's
contents can make it a stub, and a file written by any other route (a new inode,
renamed over the path) is not one. A rename keeps it; a copy does not. Anything
that reads a stored file's bytes on the storage node (``confine.open_regular`` and
the whole-directory transfers) refuses a stub (``stub_refused``) rather than hand
out the record and zeros. Plain Python.
"""

from __future__ import annotations

import errno
import os

#: The extended attribute that marks a stub (its value: ``MARK_VALUE``).
MARK = "user.air-transfer.placed"
MARK_VALUE = b"1"


def mark_stub(fd: int, path: str) -> None:
    """Mark the open file ``fd`` (to be ``path``) a stub; an OSError naming the need
    where the filesystem keeps no user extended attributes."""
    try:
        os.setxattr(fd, MARK, MARK_VALUE)
    except OSError as e:
        if e.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        raise OSError(
            e.errno,
            "node storage with placement='writer' needs a filesystem that keeps user "
            f"extended attributes (it marks each placed file's stub with {MARK!r}): "
            f"this one does not ({e.strerror})",
            path,
        ) from e


def is_stub(fd_or_path: int | str) -> bool:
    """Whether the file (an open descriptor, or a path, not followed if a link) is a
    stub; False where the filesystem keeps no extended attributes."""
    try:
        if isinstance(fd_or_path, int):
            value = os.getxattr(fd_or_path, MARK)
        else:
            value = os.getxattr(fd_or_path, MARK, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return False
        raise
    return value == MARK_VALUE


def stub_refused(path: str, verb: str = "read") -> OSError:
    """The error of a server-side ``verb`` of stub ``path``: its bytes are not here."""
    return OSError(
        errno.EOPNOTSUPP,
        f"cannot {verb} it here: it is a placed file of node storage with "
        "placement='writer', whose bytes are on its holder nodes, not in the storage "
        "(this copy holds only a record of where); read it through "
        "storage_filesystem(..., placement='writer')",
        path,
    )


def mark_root(root: str) -> None:
    """Mark the storage root ``root`` as one that holds stubs (once is enough)."""
    if not is_stub(root):
        os.setxattr(root, MARK, MARK_VALUE, follow_symlinks=False)


def refuse_placed_root(root: str, what: str) -> None:
    """ValueError if node storage ``root`` holds stubs (``mark_root``): ``what`` (a
    drain that does not know where their bytes are) would read records and zeros."""
    if os.path.isdir(root) and is_stub(root):
        raise ValueError(
            f"node storage {root!r} holds placed files of placement='writer' (their "
            f"bytes on their holder nodes, not in it): cannot {what}; open it as "
            "storage_filesystem(..., placement='writer', durable=...) does"
        )
