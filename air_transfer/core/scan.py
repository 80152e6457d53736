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
import os
import posixpath
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow.fs as pafs

from air_transfer.core.entry import Entry
from air_transfer.core.names import MAX_PATH_BYTES, check_relative_path
from air_transfer.core.scan_result import FileRow, Scan, Stamp
from air_transfer.errors import ManifestError, SourceChangedError

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

    def open(self, relpath: str) -> Any:
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
#: Opening a directory seen by ``lstat`` during the walk: never through a symlink.
_SUBDIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _scan_local(source: Source, follow_symlinks: bool) -> list[Entry | FileRow]:
    """The walk holds one directory open at a time and looks at each entry relative
    to it (``dir_fd``, never following a symlink unless it decides to), so what it
    lists is the tree it opened even while a directory on the way is swapped for a
    symlink; it goes back up through ``..``, checking it is where it came from."""
    root = source.root
    try:
        fd = source.open_dir()
    except NotADirectoryError:
        raise NotADirectoryError(f"checkpoint source {root!r} is not a directory") from None
    real_root = source.realpath()
    rows: list[Entry | FileRow] = []
    # Depth-first with an explicit stack (no recursion: trees may be thousands of
    # levels deep). A frame is a directory's sorted names still to visit, its
    # relative path, its (dev, ino), and whether it was entered through a symlink
    # (its ``..`` is then not the directory above it): `visiting` holds the frames'
    # keys, i.e. the directories on the current path, so a followed link back up
    # one is a loop.
    stack: list[tuple[Iterator[str], str, tuple[int, int], bool]] = []
    visiting: set[tuple[int, int]] = set()

    def enter(sub: int, rel_dir: str, linked: bool) -> os.stat_result:
        """List the directory open as ``sub`` and make it the current one."""
        nonlocal fd
        try:
            st = os.fstat(sub)
            key = (st.st_dev, st.st_ino)
            if key in visiting:
                raise ManifestError(
                    f"directory {os.path.join(root, rel_dir)!r} is reached again through "
                    "a symlink (a loop)"
                )
            names = sorted(os.listdir(sub))
        except BaseException:
            if sub != fd:
                os.close(sub)
            raise
        if sub != fd:
            os.close(fd)
            fd = sub
        stack.append((iter(names), rel_dir, key, linked))
        visiting.add(key)
        return st

    # What every entry calls, bound once: 20,000 files take ~0.05 s, mostly the stats.
    lstat, S_ISREG, row = os.stat, stat.S_ISREG, rows.append
    try:
        enter(fd, "", False)
        while stack:
            listing, rel_dir, dir_key, linked = stack[-1]
            prefix = f"{rel_dir}/" if rel_dir else ""
            # The current directory's entries until one is a directory to enter
            # (``enter`` pushes it; this one resumes where it stopped) or none is left.
            for name in listing:
                rel = prefix + name
                if len(rel) > _SHORT_PATH:  # may be over PATH_MAX in bytes
                    check_relative_path(rel)
                try:
                    lst = lstat(name, dir_fd=fd, follow_symlinks=False)
                    mode = lst.st_mode
                    if S_ISREG(mode):  # most entries: nothing more to look at
                        row((rel, lst))
                        continue
                    target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(mode) else ""
                except OSError as e:
                    raise _named(e, root, rel) from None
                if stat.S_ISLNK(mode):
                    resolved = source.realpath(rel)
                    inside = resolved == real_root or resolved.startswith(real_root + os.sep)
                    if inside:
                        if os.path.isabs(target) or not _stays_inside(rel, target):
                            # Absolute (or roundabout) links into the tree are stored
                            # relative, so they still point inside on the consumer.
                            parent = os.path.join(real_root, *rel.split("/")[:-1])
                            target = os.path.relpath(resolved, parent).replace(os.sep, "/")
                        row(Entry(rel, "symlink", 0, 0o777, lst.st_mtime_ns, target))
                        continue
                    if not follow_symlinks:
                        raise ManifestError(
                            f"symlink {os.path.join(root, rel)!r} -> {target!r} points "
                            f"outside the checkpoint {root!r}; remove it, make it relative "
                            "inside the checkpoint, or pass "
                            "TransferConfig(follow_symlinks=True) to pack its target"
                        )
                    try:
                        lst = source.stat(rel)
                    except FileNotFoundError as e:
                        raise ManifestError(
                            f"symlink {os.path.join(root, rel)!r} -> {target!r} is dangling "
                            "and points outside the checkpoint"
                        ) from e
                    if stat.S_ISDIR(lst.st_mode):
                        lst = enter(source.open_dir(rel), rel, True)
                        row(_dir_entry(rel, lst))
                        break
                elif stat.S_ISDIR(mode):
                    try:
                        sub = os.open(name, _SUBDIR, dir_fd=fd)
                    except NotADirectoryError as e:  # a symlink (or a file) now
                        raise _swapped(root, rel) from e
                    except OSError as e:
                        if e.errno != errno.ELOOP:
                            raise _named(e, root, rel) from None
                        raise _swapped(root, rel) from e
                    row(_dir_entry(rel, enter(sub, rel, False)))
                    break
                if S_ISREG(lst.st_mode):  # a followed symlink's target
                    row((rel, lst))
                else:
                    raise ManifestError(
                        f"{os.path.join(root, rel)!r} is neither a file, a directory nor a "
                        "symlink (a socket, FIFO or device) and cannot be checkpointed"
                    )
            else:  # this directory is done: back up to its parent
                stack.pop()
                visiting.discard(dir_key)
                if stack:
                    up = _back_up(source, fd, stack[-1][1], stack[-1][2], linked)
                    os.close(fd)
                    fd = up
    finally:
        os.close(fd)
    return rows


def _dir_entry(rel: str, st: os.stat_result) -> Entry:
    return Entry(rel, "dir", 0, stat.S_IMODE(st.st_mode), st.st_mtime_ns)


def _back_up(source: Source, fd: int, rel_dir: str, key: tuple[int, int], linked: bool) -> int:
    """The directory ``rel_dir`` (``key``) again, from its subdirectory open as ``fd``:
    through ``..``, or, for one entered through a symlink, from the source's root;
    SourceChangedError if it is not the directory the walk left."""
    up = source.open_dir(rel_dir) if linked else os.open("..", _SUBDIR, dir_fd=fd)
    st = os.fstat(up)
    if (st.st_dev, st.st_ino) != key:
        os.close(up)
        raise _swapped(source.root, rel_dir)
    return up


def _swapped(root: str, rel: str) -> SourceChangedError:
    where = os.path.join(root, rel) if rel else root
    return SourceChangedError(
        errno.EAGAIN,
        "changed while the directory was scanned (a directory moved, or replaced by "
        "a symlink or a file); pack it again once it is stable",
        where,
    )


def _named(e: OSError, root: str, rel: str) -> OSError:
    """``e`` naming the entry's path (a ``dir_fd`` call names only its last part)."""
    return type(e)(e.errno, e.strerror, os.path.join(root, rel))


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
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    base = root.rstrip("/")
    entries = []
    stamps: dict[str, Stamp] = {}
    for i in infos:
        rel = i.path[len(base) :].lstrip("/") if base else i.path.lstrip("/")
        mtime = i.mtime_ns or 0
        if i.type == pafs.FileType.Directory:
            entries.append(Entry(rel, "dir", 0, 0o755, mtime))
        elif i.type == pafs.FileType.File:
            entries.append(Entry(rel, "file", i.size, 0o644, mtime))
            stamps[rel] = Stamp.of_info(i)
        else:
            raise ManifestError(f"{i.path!r} on {fs.type_name} has unsupported type {i.type}")
    return sorted(entries, key=lambda e: e.path.split("/")), stamps
