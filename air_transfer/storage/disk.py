"""Node storage, the storage-node side: metadata operations on this node's disk.

Runs in the agent of the storage node (``NodeAgent.disk`` dispatches to these
methods): every metadata operation of ``storage_filesystem`` is one call to one of
them (file bodies: ``disk_uploads``). They keep no state between calls, so the
agent's threads may run them in any order.

Paths arrive already normalised and checked against the storage root lexically (see
``storage_path``); here the real path is checked too, so a symlink cannot lead out of
the root. Errors are the built-in ``OSError`` subclasses a local pyarrow filesystem
raises, naming the path. Plain Python: unit-tested without Ray.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shutil
import stat
from typing import ClassVar

import pyarrow.fs as pafs

#: Marks the staging files of uploads in progress (``disk_uploads``); listings
#: leave them out.
STAGING_MARK = ".air-upload-"

#: (type, size, mtime_ns) of one path, as ``pyarrow.fs.FileInfo`` takes them.
Info = tuple[int, int | None, int | None]


def storage_path(root: str, path: str) -> str:
    """The absolute node path that ``path`` names: itself if absolute, else under
    ``root``; normalised. PermissionError if it leaves ``root``."""
    if not isinstance(path, str):
        raise TypeError(f"a storage path must be a str, got {type(path).__name__}")
    if "\x00" in path:
        raise ValueError(f"storage path {path!r} contains a NUL byte")
    joined = posixpath.normpath(posixpath.join(root, path))
    joined = "/" + joined.lstrip("/")  # normpath keeps a leading "//"
    if not _inside(root, joined):
        raise PermissionError(
            f"path {path!r} ({joined!r}) is outside the storage root {root!r} of this "
            "air-transfer node storage; refused"
        )
    return joined


def checked_path(root: str, path: str) -> str:
    """``storage_path`` checked on this node too: its real location (symlinks
    resolved) must be inside ``root``."""
    return real_path(root, storage_path(root, path))


def _inside(root: str, path: str) -> bool:
    return root == "/" or path == root or path.startswith(root + "/")


def oserror(kind: type[OSError], code: int, path: str, detail: str = "") -> OSError:
    return kind(code, f"{os.strerror(code)}{detail}", path)


class DiskStorage:
    """The node-side half of ``storage_filesystem``: operations on this node's disk."""

    #: The operations the agent may run (``NodeAgent.disk``).
    OPS: ClassVar[frozenset[str]] = frozenset(
        {
            "fs_info",
            "fs_list",
            "fs_create_dir",
            "fs_delete_dir",
            "fs_delete_dir_contents",
            "fs_delete_file",
            "fs_move",
        }
    )

    # -- metadata ------------------------------------------------------------------
    def fs_info(self, root: str, paths: list[str]) -> list[Info]:
        return [_info(real_path(root, p)) for p in paths]

    def fs_list(
        self, root: str, base: str, recursive: bool, allow_not_found: bool
    ) -> list[tuple[str, int, int | None, int | None]]:
        """``(relative path, type, size, mtime_ns)`` of what is under ``base``."""
        try:
            st = os.stat(real_path(root, base))
        except FileNotFoundError:
            if allow_not_found:
                return []
            raise
        if not stat.S_ISDIR(st.st_mode):
            raise oserror(NotADirectoryError, errno.ENOTDIR, base, ": cannot list it")
        out: list[tuple[str, int, int | None, int | None]] = []

        def walk(directory: str, rel: str) -> None:
            with os.scandir(directory) as it:
                for d in it:
                    if STAGING_MARK in d.name:
                        continue
                    child = f"{rel}{d.name}"
                    out.append((child, *_info(d.path)))
                    if recursive and d.is_dir(follow_symlinks=False):
                        walk(d.path, child + "/")

        walk(base, "")
        return out

    def fs_create_dir(self, root: str, path: str, recursive: bool) -> None:
        path = real_path(root, path)
        if os.path.isdir(path):
            return
        if recursive:
            os.makedirs(path)
        else:
            os.mkdir(path)

    def fs_delete_dir(self, root: str, path: str) -> None:
        if real_path(root, path) == root:
            raise PermissionError(f"refusing to delete the storage root {root!r} itself")
        _require_dir(path)
        shutil.rmtree(path)

    def fs_delete_dir_contents(self, root: str, path: str, missing_dir_ok: bool) -> None:
        if real_path(root, path) == "/":
            raise PermissionError("refusing to delete the contents of '/'")
        try:
            _require_dir(path)
        except FileNotFoundError:
            if missing_dir_ok:
                return
            raise
        with os.scandir(path) as it:
            for d in it:
                if d.is_dir(follow_symlinks=False):
                    shutil.rmtree(d.path)
                else:
                    os.unlink(d.path)

    def fs_delete_file(self, root: str, path: str) -> None:
        os.unlink(real_path(root, path))

    def fs_move(self, root: str, src: str, dest: str) -> None:
        os.rename(real_path(root, src), real_path(root, dest))


def real_path(root: str, path: str) -> str:
    """``path`` if its real location (symlinks resolved) is inside ``root``."""
    if root != "/" and not _inside(os.path.realpath(root), os.path.realpath(path)):
        raise PermissionError(
            f"{path!r} leads outside the storage root {root!r} through a symlink; refused"
        )
    return path


def _info(path: str) -> Info:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return (pafs.FileType.NotFound, None, None)
    if stat.S_ISDIR(st.st_mode):
        return (pafs.FileType.Directory, None, st.st_mtime_ns)
    if stat.S_ISREG(st.st_mode):
        return (pafs.FileType.File, st.st_size, st.st_mtime_ns)
    return (pafs.FileType.Unknown, None, st.st_mtime_ns)


def _require_dir(path: str) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise oserror(NotADirectoryError, errno.ENOTDIR, path)
