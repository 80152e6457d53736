"""Walk a checkpoint directory into manifest entries, with a ``Stamp`` of every file.

Works on any pyarrow filesystem (``ChunkedCheckpoint.from_checkpoint`` packs from S3,
GCS or a mock as well as from local disk); locally it uses ``os.lstat`` so that modes
and symlinks are seen, which pyarrow's FileInfo hides. Iterative: a tree of any depth
scans without hitting the recursion limit. Stamps stay on the packing side (ctime,
inode and device mean nothing on another host): reads are proven against them
(``proven_read``).
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import stat
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
import pyarrow.fs as pafs

from air_transfer.core.dirtree import DirCursor, Loop, Visit, walk
from air_transfer.core.entry import Entry
from air_transfer.core.fs_listing import list_below
from air_transfer.core.names import MAX_PATH_BYTES, check_relative_path
from air_transfer.core.scan_result import FileRow, Scan, Stamp
from air_transfer.errors import ManifestError, SourceChangedError, error_at

__all__ = ["Scan", "Source", "Stamp", "scan"]


@dataclass(frozen=True)
class Source:
    """A checkpoint directory to pack: a pyarrow filesystem and a path on it.

    It pickles, so the reading can happen in another process (a node agent).
    """

    filesystem: pafs.FileSystem
    root: str

    #: Whether no file here is ever written in place, every write replacing the file
    #: (node storage: uploads, merges and links all publish by a rename), so that a
    #: file's inode, size and mtime name its bytes. Its ctime and link count then
    #: change only as other names of it come and go (an incremental save's hard
    #: links, a deleted checkpoint's unlinks), and reads do not compare them
    #: (``proven_read``; why: docs/design.md, "Stored files: ...").
    replaced_not_rewritten: ClassVar[bool] = False

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    def local_path(self, relpath: str) -> str:
        return os.path.join(self.root, *relpath.split("/"))

    def open(self, relpath: str) -> io.FileIO | pa.NativeFile:
        """Open one file of the checkpoint for reading, unbuffered where local."""
        if self.is_local:
            return open(self.local_path(relpath), "rb", buffering=0)
        return self.filesystem.open_input_stream(posixpath.join(self.root, relpath))

    def open_dir(self, relpath: str = "") -> int:
        """A descriptor of the local directory ``relpath`` ("": the root), symlinks
        followed; the caller closes it. (Overridden where the source is confined.)"""
        path = self.local_path(relpath) if relpath else self.root
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def stat(self, relpath: str) -> os.stat_result:
        """The local entry ``relpath``, symlinks followed."""
        return os.stat(self.local_path(relpath))

    def realpath(self, relpath: str = "") -> str:
        """The real path of the local ``relpath`` ("": the root)."""
        return os.path.realpath(self.local_path(relpath) if relpath else self.root)


def scan(source: Source, follow_symlinks: bool = False) -> Scan:
    """List every entry under ``source`` in a stable order (parents first, siblings
    sorted by name), with a stamp of every file.

    Raises FileNotFoundError if the source is missing, NotADirectoryError if it is a
    file, and ManifestError for a symlink leaving the checkpoint unless
    ``follow_symlinks`` asks to pack what it points to. A local walk lists only names
    a manifest holds (it checks the one limit a directory can exceed, PATH_MAX).
    """
    if source.is_local:
        return Scan(_scan_local(source, follow_symlinks))
    entries, stamps = _scan_pyarrow(source)
    return Scan(entries, stamps)


#: Paths up to this many characters are within PATH_MAX whatever they encode to (at
#: most 4 bytes a character); a longer one is checked as a manifest would check it.
_SHORT_PATH = MAX_PATH_BYTES // 4
#: What the walk raises when the tree changed under it: a directory it was to enter
#: is a file or a symlink now, or one it came from is no longer above it.
_CHANGED = frozenset({errno.ENOTDIR, errno.ELOOP, errno.ESTALE})


def _scan_local(source: Source, follow_symlinks: bool) -> list[Entry | FileRow]:
    """The walk (``core.dirtree.walk``) holds one directory open at a time and looks
    at each entry relative to it, never following a symlink unless this decides to,
    so what it lists is the tree it opened even while a directory on the way is
    swapped for a symlink; it goes back up checking it is where it came from."""
    root = source.root
    try:
        fd = source.open_dir()
    except NotADirectoryError:
        raise NotADirectoryError(f"checkpoint source {root!r} is not a directory") from None
    links = _Links(source, follow_symlinks)
    rows: list[Entry | FileRow] = []
    # What every entry does, bound once: 20,000 files take ~0.1 s, mostly the stats.
    row, S_ISREG = rows.append, stat.S_ISREG
    with DirCursor(root, fd) as cursor:
        try:
            for v in walk(cursor, ordered=True, missing_ok=False):
                if len(v.relpath) > _SHORT_PATH:  # may be over PATH_MAX in bytes
                    check_relative_path(v.relpath)
                if S_ISREG(v.st.st_mode):  # most entries: nothing more to look at
                    row((v.relpath, v.st))
                elif v.event == "enter":
                    row(_dir_entry(v.relpath, v.st))
                elif v.kind == "symlink":
                    row(links.entry(cursor, v))
                elif v.event != "leave":
                    raise _special(root, v.relpath)
        except Loop as e:
            raise ManifestError(
                f"directory {e.filename!r} is reached again through a symlink (a loop)"
            ) from None
        except OSError as e:
            if e.errno in _CHANGED and not isinstance(e, SourceChangedError):
                raise _swapped(e.filename or root) from e
            raise
    return rows


class _Links:
    """What a symlink met by the scan becomes: a symlink entry if it stays inside
    the checkpoint (stored relative, so it still points inside on the consumer);
    else, if ``follow``, what it points to (a file, or a directory the walk enters);
    else a ManifestError."""

    def __init__(self, source: Source, follow: bool) -> None:
        self.source, self.follow = source, follow
        self.real_root = source.realpath()

    def entry(self, cursor: DirCursor, v: Visit) -> Entry | FileRow:
        source, rel, root = self.source, v.relpath, self.source.root
        try:
            target = os.readlink(v.name, dir_fd=cursor.fd)
        except OSError as e:
            raise error_at(e, cursor.where(v.name), "readlink") from None
        resolved, real_root = source.realpath(rel), self.real_root
        if resolved == real_root or resolved.startswith(real_root + os.sep):
            if os.path.isabs(target) or not _stays_inside(rel, target):
                parent = os.path.join(real_root, *rel.split("/")[:-1])
                target = os.path.relpath(resolved, parent).replace(os.sep, "/")
            return Entry(rel, "symlink", 0, 0o777, v.st.st_mtime_ns, target)
        if not self.follow:
            raise ManifestError(
                f"symlink {os.path.join(root, rel)!r} -> {target!r} points outside the "
                f"checkpoint {root!r}; remove it, make it relative inside the checkpoint, "
                "or pass TransferConfig(follow_symlinks=True) to pack its target"
            )
        try:
            st = source.stat(rel)
        except FileNotFoundError as e:
            raise ManifestError(
                f"symlink {os.path.join(root, rel)!r} -> {target!r} is dangling and points "
                "outside the checkpoint"
            ) from e
        if stat.S_ISDIR(st.st_mode):
            parent = posixpath.dirname(rel)
            sub = source.open_dir(rel)
            cursor.follow(v.name, sub, lambda: source.open_dir(parent))
            return _dir_entry(rel, os.fstat(cursor.fd))
        if stat.S_ISREG(st.st_mode):
            return (rel, st)
        raise _special(root, rel)


def _special(root: str, rel: str) -> ManifestError:
    """What a socket, FIFO or device in a checkpoint is (or a symlink to one)."""
    return ManifestError(
        f"{os.path.join(root, rel)!r} is neither a file, a directory nor a symlink "
        "(a socket, FIFO or device) and cannot be checkpointed"
    )


def _dir_entry(rel: str, st: os.stat_result) -> Entry:
    return Entry(rel, "dir", 0, stat.S_IMODE(st.st_mode), st.st_mtime_ns)


def _swapped(where: str) -> SourceChangedError:
    return SourceChangedError(
        errno.EAGAIN,
        "changed while the directory was scanned (a directory moved, or replaced by "
        "a symlink or a file); pack it again once it is stable",
        where,
    )


def _stays_inside(rel: str, target: str) -> bool:
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    return resolved != ".." and not resolved.startswith("../")


def _scan_pyarrow(source: Source) -> tuple[list[Entry], dict[str, Stamp]]:
    fs, root = source.filesystem, source.root
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"checkpoint source {root!r} does not exist on {fs.type_name}")
    if info.type != pafs.FileType.Directory:
        raise NotADirectoryError(f"checkpoint source {root!r} on {fs.type_name} is not a directory")
    entries = []
    stamps: dict[str, Stamp] = {}
    for rel, i in list_below(fs, root):
        mtime = i.mtime_ns or 0
        if i.type == pafs.FileType.Directory:
            entries.append(Entry(rel, "dir", 0, 0o755, mtime))
        elif i.type == pafs.FileType.File:
            entries.append(Entry(rel, "file", i.size, 0o644, mtime))
            stamps[rel] = Stamp.of_info(i)
        else:
            raise ManifestError(f"{i.path!r} on {fs.type_name} has unsupported type {i.type}")
    return sorted(entries, key=lambda e: e.path.split("/")), stamps
