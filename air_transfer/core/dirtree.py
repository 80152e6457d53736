"""Walking directory trees of any depth, following no symlink unasked.

Every deep walk of the package is one of the two here (and the one tree remover,
``core.tree_removal``, climbs as ``walk`` does, with its helpers):

- ``walk``, holding ONE directory descriptor (below): for a tree this process owns,
  such as a target being merged or a checkpoint being scanned (``core.scan``, which
  follows some symlinks into the directories they lead to: ``DirCursor.follow``,
  a directory met again on the way down is a ``Loop``), of any depth whatever the
  limit on open files; a tree moved while it is walked stops the walk.
- ``walk_dirs``, holding a descriptor per level: for trees others change meanwhile
  (node storage, where 32 agent threads and Train's workers work at once). Each
  level stays open, so a directory moved or removed under the walk is still the one
  it lists, and an entry that vanished since it was listed is skipped.

Why not ``os.walk`` / ``shutil.rmtree``: on Python 3.11 both recurse once per level, so
a 1,200-level checkpoint raised ``RecursionError`` from the writer's cleanup; and paths
joined level by level pass ``PATH_MAX`` (4096) long before a tree is too deep to exist.
Here one loop walks the tree holding ONE directory descriptor: it goes down by name
(``O_NOFOLLOW``, relative to the open directory) and back up through ``..``, checking
that ``..`` is the very directory it came down from (device and inode), so a tree moved
while it is walked stops the walk instead of leading it astray. Memory is the pending
names of the directories above the current one. Errors name the path they hit.

Plain Python (POSIX ``*at`` calls through ``dir_fd``): unit-tested without Ray.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from air_transfer.core.confine import Raced, Where, open_listable
from air_transfer.errors import error_at

Kind = Literal["dir", "file", "symlink", "other"]
Event = Literal["enter", "leave", "entry"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class DirCursor:
    """One open directory of a tree that moves down by name and up through ``..``.

    ``fd``: the top already open (the cursor owns it from then on), for a caller that
    opens it its own way (``core.scan``: through a symlink, or confined to a root)."""

    def __init__(self, root: str, fd: int | None = None) -> None:
        self.root = root
        if fd is None:
            try:
                fd = os.open(root, DIR_FLAGS)
            except OSError as e:
                raise error_at(e, root, "opening a directory") from e
        self.fd = fd
        self._ids = [identity(self.fd)]
        self._names: list[str] = []
        #: Per level below the top: None (its parent is its ``..``), or how to open
        #: its parent again (a directory entered through a symlink: ``follow``).
        self._reopen: list[Callable[[], int] | None] = []

    @property
    def depth(self) -> int:
        return len(self._names)

    def where(self, name: str = "") -> str:
        """The path of ``name`` in the current directory, for messages."""
        return path_of(self.root, self._names, name)

    def here(self) -> str:
        return path_of(self.root, self._names)

    def down(self, name: str) -> None:
        """Into subdirectory ``name``, never through a symlink."""
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
        except OSError as e:
            raise error_at(e, self.where(name), "opening a directory") from e
        self._enter(fd, name, None)

    def follow(self, name: str, fd: int, reopen_parent: Callable[[], int]) -> None:
        """Into the directory open as ``fd`` (owned by the cursor from now), which the
        symlink ``name`` here leads to; on the way back up, ``reopen_parent`` opens
        this directory again (the followed one's ``..`` is elsewhere)."""
        self._enter(fd, name, reopen_parent)

    def _enter(self, fd: int, name: str, reopen: Callable[[], int] | None) -> None:
        try:
            ident = identity(fd)
            if ident in self._ids:  # a directory above, reached again: a loop
                raise Loop(errno.ELOOP, "a directory above it, reached again", self.where(name))
        except BaseException:
            os.close(fd)
            raise
        os.close(self.fd)
        self.fd = fd
        self._ids.append(ident)
        self._names.append(name)
        self._reopen.append(reopen)

    def up(self) -> str:
        """Go back to the parent (checked to be the directory the cursor came down
        from, else ESTALE); returns the name of the directory left."""
        reopen = self._reopen[-1]
        if reopen is None:
            fd = open_parent(self.fd, self._ids[-2], self.here())
        else:
            fd = reopen()
            if identity(fd) != self._ids[-2]:
                os.close(fd)
                raise _moved(path_of(self.root, self._names[:-1]))
        os.close(self.fd)
        self.fd = fd
        self._ids.pop()
        self._reopen.pop()
        return self._names.pop()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> DirCursor:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Loop(OSError):
    """A walk reached a directory that is above it on its path (through a symlink it
    followed, or a bind mount): walking on would never end."""


class Visit(NamedTuple):
    """One step of ``walk``: ``enter`` (a directory, before its entries), ``leave``
    (after them) or ``entry`` (anything else). During the step ``cursor`` is open on
    the directory that contains ``name``."""

    event: Event
    relpath: str
    name: str
    kind: Kind
    st: os.stat_result


def walk(cursor: DirCursor, ordered: bool = False, missing_ok: bool = True) -> Iterator[Visit]:
    """Every entry under the cursor's directory, depth first, by ``lstat`` (siblings
    in name order if ``ordered``: parents first, as a manifest lists them). An entry
    that vanishes while listed is skipped (FileNotFoundError naming it unless
    ``missing_ok``: a scan must not list less than the tree); the cursor ends where
    it started.

    During the ``entry`` step of a symlink, the caller may ``cursor.follow`` it into
    the directory it leads to: the walk then goes through that directory as through
    any other (a ``leave`` step ends it)."""
    frames: list[tuple[str, str, os.stat_result | None, list[str]]] = [
        ("", "", None, _listdir(cursor, ordered))
    ]
    lstat, is_file = os.stat, stat.S_ISREG  # bound once: a file costs its lstat, little more
    while frames:
        relpath, name, st, pending = frames[-1]
        prefix = f"{relpath}/" if relpath else ""
        while pending:  # this directory's entries, until one is a directory to walk
            child = pending.pop()
            try:
                child_st = lstat(child, dir_fd=cursor.fd, follow_symlinks=False)
            except OSError as e:
                if missing_ok and isinstance(e, FileNotFoundError):
                    continue
                raise error_at(e, cursor.where(child), "lstat") from e
            if is_file(child_st.st_mode):
                yield Visit("entry", prefix + child, child, "file", child_st)
                continue
            child_rel, kind = prefix + child, kind_of(child_st.st_mode)
            if kind != "dir":
                depth = cursor.depth
                yield Visit("entry", child_rel, child, kind, child_st)
                if cursor.depth == depth:
                    continue
                child_st = os.fstat(cursor.fd)  # followed: a directory to walk
            else:
                yield Visit("enter", child_rel, child, kind, child_st)
                cursor.down(child)
            frames.append((child_rel, child, child_st, _listdir(cursor, ordered)))
            break
        else:  # done with this directory: back up
            frames.pop()
            if st is not None:
                cursor.up()
                yield Visit("leave", relpath, name, "dir", st)


@dataclass
class Level:
    """A directory ``walk_dirs`` is in: its descriptor (open while the walk is below
    it), the descriptor of the directory holding it (-1 for the top) and its name
    there, its path from the top (``""``, else ending in ``/``), and how often
    ``leave`` asked to list it again."""

    fd: int
    parent: int
    name: str
    rel: str
    rounds: int = 0
    subdirs: list[str] = field(default_factory=list)


#: Opens subdirectory ``name`` of the open directory ``parent``: its descriptor, or
#: None to skip it (gone, or no longer a directory, since it was listed).
OpenDir = Callable[[int, str], "int | None"]


def open_dir_or_none(parent: int, name: str) -> int | None:
    """Subdirectory ``name`` of ``parent`` opened for listing, never through a
    symlink; None if it vanished, or is no longer a directory, since it was listed."""
    try:
        return open_listable(Where(parent, name, name))
    except (FileNotFoundError, NotADirectoryError, Raced):
        return None


def walk_dirs(
    top: Level,
    visit: Callable[[Level], list[str]],
    leave: Callable[[Level], list[str] | None] | None = None,
    open_dir: OpenDir = open_dir_or_none,
) -> None:
    """Depth first from the open directory ``top`` (closed here, as every level is):
    ``visit(level)`` lists a directory and returns the names of the subdirectories
    to walk (in last-first order); once they are walked, ``leave(level)`` returns
    None (done) or a list (what appeared meanwhile: walked, then ``leave`` again). A
    subdirectory that ``open_dir`` cannot open is skipped."""
    stack = [top]
    try:
        top.subdirs = visit(top)
        while stack:
            level = stack[-1]
            if level.subdirs:
                name = level.subdirs.pop()
                fd = open_dir(level.fd, name)
                if fd is not None:
                    stack.append(Level(fd, level.fd, name, f"{level.rel}{name}/"))
                    stack[-1].subdirs = visit(stack[-1])
                continue
            if leave is not None:
                more = leave(level)
                if more is not None:
                    level.subdirs = more
                    continue
            os.close(stack.pop().fd)
    finally:
        for level in stack:
            os.close(level.fd)


def kind_of(mode: int) -> Kind:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _listdir(cursor: DirCursor, ordered: bool = False) -> list[str]:
    """The names in the cursor's directory, last first if ``ordered`` (the walk
    takes them from the end)."""
    try:
        names = os.listdir(cursor.fd)
        if ordered:
            names.sort(reverse=True)
        return names
    except OSError as e:
        raise error_at(e, cursor.here(), "listing a directory") from e


def identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def path_of(root: str, names: list[str], name: str = "") -> str:
    """The path of ``name`` (of the directory itself if none) in the directory
    reached from ``root`` down ``names``, for messages."""
    return os.path.join(root, *names, name) if name else os.path.join(root, *names)


def open_parent(fd: int, ident: tuple[int, int], here: str) -> int:
    """The directory above the open directory ``fd`` (``here``), through ``..``,
    checked to be ``ident``, the one the walk came down from (else ESTALE: the tree
    was moved). An error names ``here`` and keeps its errno (a ``..`` gone with a
    removed directory is a ``FileNotFoundError``)."""
    try:
        parent = os.open("..", DIR_FLAGS, dir_fd=fd)
    except OSError as e:
        raise error_at(e, here, "opening its parent") from e
    if identity(parent) != ident:
        os.close(parent)
        raise _moved(here)
    return parent


_MOVED = "the directory was moved while it was being walked; nothing more was done"


def _moved(path: str) -> OSError:
    return OSError(errno.ESTALE, _MOVED, path)
