"""Walking and removing directory trees of any depth, without following symlinks.

Every deep walk of the package is one of the two here:

- ``walk`` (and ``rmtree`` on it), holding ONE directory descriptor (below): for a
  tree this process owns, such as its staging, of any depth whatever the limit on
  open files; a tree moved while it is walked stops the walk.
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
names of the directories above the current one.

Plain Python (POSIX ``*at`` calls through ``dir_fd``): unit-tested without Ray.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from air_transfer.core.confine import Raced, Where, open_listable
from air_transfer.errors import error_at

Kind = Literal["dir", "file", "symlink", "other"]
Event = Literal["enter", "leave", "entry"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class DirCursor:
    """One open directory of a tree that moves down by name and up through ``..``."""

    def __init__(self, root: str) -> None:
        self.root = root
        try:
            self.fd = os.open(root, _DIR_FLAGS)
        except OSError as e:
            raise error_at(e, root, "opening a directory") from e
        self._ids = [_identity(self.fd)]
        self._names: list[str] = []

    def where(self, name: str = "") -> str:
        """The path of ``name`` in the current directory, for messages."""
        return os.path.join(self.root, *self._names, name) if name else self.here()

    def here(self) -> str:
        return os.path.join(self.root, *self._names)

    def down(self, name: str) -> None:
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except OSError as e:
            raise error_at(e, self.where(name), "opening a directory") from e
        os.close(self.fd)
        self.fd = fd
        self._ids.append(_identity(fd))
        self._names.append(name)

    def up(self) -> str:
        """Go back to the parent; returns the name of the directory left."""
        try:
            fd = os.open("..", _DIR_FLAGS, dir_fd=self.fd)
        except OSError as e:
            raise error_at(e, self.here(), "opening its parent") from e
        if _identity(fd) != self._ids[-2]:
            os.close(fd)
            raise OSError(
                errno.ESTALE,
                "the directory was moved while it was being walked; nothing more was done",
                self.here(),
            )
        os.close(self.fd)
        self.fd = fd
        self._ids.pop()
        return self._names.pop()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> DirCursor:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@dataclass(frozen=True)
class Visit:
    """One step of ``walk``: ``enter`` (a directory, before its entries), ``leave``
    (after them) or ``entry`` (anything else). During the step ``cursor`` is open on
    the directory that contains ``name``."""

    event: Event
    relpath: str
    name: str
    kind: Kind
    st: os.stat_result


def walk(cursor: DirCursor) -> Iterator[Visit]:
    """Every entry under the cursor's directory, depth first, by ``lstat``. An entry
    that vanishes while listed is skipped; the cursor ends where it started."""
    frames: list[tuple[str, str, os.stat_result | None, list[str]]] = [
        ("", "", None, _listdir(cursor))
    ]
    while frames:
        relpath, name, st, pending = frames[-1]
        if not pending:
            frames.pop()
            if st is not None:
                cursor.up()
                yield Visit("leave", relpath, name, "dir", st)
            continue
        child = pending.pop()
        child_rel = f"{relpath}/{child}" if relpath else child
        try:
            child_st = os.stat(child, dir_fd=cursor.fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise error_at(e, cursor.where(child), "lstat") from e
        kind = kind_of(child_st.st_mode)
        if kind != "dir":
            yield Visit("entry", child_rel, child, kind, child_st)
            continue
        yield Visit("enter", child_rel, child, kind, child_st)
        cursor.down(child)
        frames.append((child_rel, child, child_st, _listdir(cursor)))


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


def rmtree(path: str) -> None:
    """Remove ``path`` and everything under it, never following a symlink nor entering
    another filesystem mounted inside; a missing ``path`` is fine. Directories without
    owner permissions get them first (a checkpoint may hold read-only directories).
    Errors name the path they hit."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        _unlink(path)
        return
    _let_owner_in(path, st)
    try:
        cursor = DirCursor(path)
    except FileNotFoundError:
        return
    with cursor:
        for visit in walk(cursor):
            if visit.event == "enter":
                if visit.st.st_dev != st.st_dev:  # like rm --one-file-system
                    raise OSError(
                        errno.EXDEV,
                        "a mount point inside a tree being removed; nothing under it was removed",
                        cursor.where(visit.name),
                    )
                _let_owner_in(visit.name, visit.st, cursor)
            elif visit.event == "leave":
                _rm(os.rmdir, visit.name, cursor)
            else:
                _rm(os.unlink, visit.name, cursor)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise error_at(e, path, "removing a directory") from e


def kind_of(mode: int) -> Kind:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _listdir(cursor: DirCursor) -> list[str]:
    try:
        return os.listdir(cursor.fd)
    except OSError as e:
        raise error_at(e, cursor.here(), "listing a directory") from e


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _let_owner_in(name: str, st: os.stat_result, cursor: DirCursor | None = None) -> None:
    """Give the owner rwx on a directory about to be emptied (removing entries needs
    write and search permission on it). Directories only: files are never chmodded,
    as they may be hard links shared with a published tree."""
    if st.st_mode & stat.S_IRWXU == stat.S_IRWXU:
        return
    try:
        if cursor is None:
            os.chmod(name, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
        else:
            os.chmod(name, stat.S_IMODE(st.st_mode) | stat.S_IRWXU, dir_fd=cursor.fd)
    except FileNotFoundError:
        pass
    except OSError as e:
        where = name if cursor is None else cursor.where(name)
        raise error_at(e, where, "making a directory removable") from e


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise error_at(e, path, "removing") from e


def _rm(remove: Callable[..., None], name: str, cursor: DirCursor) -> None:
    try:
        remove(name, dir_fd=cursor.fd)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise error_at(e, cursor.where(name), "removing") from e
