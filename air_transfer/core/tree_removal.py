"""Removing a directory tree of any depth: ``remove_tree`` (``rmtree`` for a path), the
package's one tree remover.

It walks like ``core.dirtree.walk``, ONE descriptor at any depth, and works in trees
others change too: what vanished was removed by another remover working on the same
tree at once (``air-transfer clean`` and a delete share the trash of node storage),
and is skipped, as is a ``..`` gone with it (the removal starts again from the top);
a directory that fills up while it is removed is emptied again (``ROUNDS``, then
``ENOTEMPTY``). It never enters another filesystem mounted inside (EXDEV, like
``rm --one-file-system``) and gives its owner rwx on a directory it may not empty (a
checkpoint may hold read-only directories). Why not ``shutil.rmtree``: see
``core.dirtree``.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field

from air_transfer.core.confine import Where
from air_transfer.core.dirtree import DIR_FLAGS, open_parent, path_of
from air_transfer.errors import error_at

#: How often a directory that keeps filling up while it is removed is emptied again.
ROUNDS = 4


def rmtree(path: str) -> int:
    """Remove ``path`` and everything under it: ``remove_tree`` on its entry in the
    directory above. A missing ``path`` is fine."""
    head, name = os.path.split(path.rstrip("/"))
    if name in ("", ".", ".."):
        raise ValueError(f"{path!r} names no directory entry to remove")
    try:
        parent = os.open(head or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise error_at(e, head or ".", "opening a directory") from e
    try:
        return remove_tree(Where(parent, name, path))
    finally:
        os.close(parent)


def remove_tree(where: Where) -> int:
    """Remove entry ``where.name`` of the open directory ``where.fd`` and everything
    under it, as the module says (``where.real`` names it in errors); something not a
    directory is unlinked, a missing one is fine. Returns how many entries this call
    removed: a remover working on the same tree at once removes the others."""
    return _Removal(where).run()


@dataclass
class _Frame:
    """A directory of a removal, the one it is in or one above: its name in the
    directory above, its identity (device, inode), its subdirectories still to
    remove, and how often it filled up again before it could be removed."""

    name: str
    ident: tuple[int, int]
    subdirs: list[str] = field(default_factory=list)
    rounds: int = 0


class _Removal:
    """One ``remove_tree``: ``fd`` is the ONE directory it holds open, the last of
    ``frames``; it goes down by name and back up through ``..``."""

    def __init__(self, where: Where) -> None:
        self.where = where
        self.fd = -1
        self.frames: list[_Frame] = []
        self.dev = -1
        self.removed = 0

    def run(self) -> int:
        try:
            going = self._start(None)
            top = self.frames[0].ident if going else None
            while going and self.frames:
                frame = self.frames[-1]
                if frame.subdirs:
                    self._down(frame.subdirs.pop())
                elif not self._up():
                    going = self._start(top)  # the way back up is gone: again from the top
        finally:
            self._close()
        return self.removed

    def _start(self, ident: tuple[int, int] | None) -> bool:
        """Open the top (if ``ident``, only the directory it was) and empty it of all
        but its subdirectories; False if there is no such directory."""
        self._close()
        self.frames = []
        if ident is not None and _identity_of(self.where) != ident:
            return False  # gone, or replaced after it was removed: not the tree asked for
        opened = self._open(self.where.fd, self.where.name, None)
        if opened is None:
            return False
        self.fd, st = opened
        self.dev = st.st_dev
        self.frames.append(_Frame(self.where.name, (st.st_dev, st.st_ino)))
        self.frames[-1].subdirs = self._clear()
        return True

    def _down(self, name: str) -> None:
        opened = self._open(self.fd, name, self.dev)
        if opened is None:
            return
        fd, st = opened
        os.close(self.fd)
        self.fd = fd
        self.frames.append(_Frame(name, (st.st_dev, st.st_ino)))
        self.frames[-1].subdirs = self._clear()

    def _up(self) -> bool:
        """Remove the emptied directory the removal is in and go up; one filled again
        meanwhile is emptied again (``ROUNDS`` times). False if the directory above
        cannot be reached (``..`` gone: another remover removed this one)."""
        frame, top = self.frames[-1], len(self.frames) == 1
        parent = self.where.fd if top else self._parent()
        if parent < 0:
            return False
        try:
            os.rmdir(frame.name, dir_fd=parent)
            self.removed += 1
        except FileNotFoundError:
            pass  # another remover removed it
        except OSError as e:
            if not top:
                os.close(parent)
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise error_at(e, self._path(), "removing a directory") from e
            if frame.rounds >= ROUNDS:
                raise error_at(e, self._path(), "it kept filling up while being deleted") from e
            frame.rounds += 1
            frame.subdirs = self._clear()
            return True
        os.close(self.fd)
        self.frames.pop()
        self.fd = -1 if top else parent
        return True

    def _parent(self) -> int:
        """The directory above, through ``..``, checked to be the one the removal came
        down from (else ESTALE); -1 if ``..`` is gone."""
        try:
            return open_parent(self.fd, self.frames[-2].ident, self._path())
        except FileNotFoundError:
            return -1

    def _open(self, parent: int, name: str, dev: int | None) -> tuple[int, os.stat_result] | None:
        """Directory ``name`` of ``parent`` opened, never through a symlink, with rwx
        for its owner (removing entries needs them; files are never chmodded, as they
        may be hard links shared with a published tree); EXDEV if it is not on ``dev``
        (a mount point, like ``rm --one-file-system``). None if it is gone, or is not
        a directory (then unlinked)."""
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        except PermissionError:  # one its owner may not read: let the owner in first
            fd = self._let_owner_in(parent, name, dev)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise error_at(e, self._path(name), "opening a directory") from e
            fd = -1
        if fd < 0:
            self._unlink(parent, name)
            return None
        st = os.fstat(fd)
        if dev is not None and st.st_dev != dev:
            os.close(fd)
            raise _mount_point(self._path(name))
        if st.st_mode & stat.S_IRWXU != stat.S_IRWXU and st.st_uid == os.geteuid():
            try:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
            except OSError as e:
                os.close(fd)
                raise error_at(e, self._path(name), "making a directory removable") from e
        return fd, st

    def _let_owner_in(self, parent: int, name: str, dev: int | None) -> int:
        """``_open`` for a directory its owner may not read: chmod by name, never
        following a symlink, then open; -1 if it is not (or no longer) a directory."""
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return -1
        except OSError as e:
            raise error_at(e, self._path(name), "lstat") from e
        if not stat.S_ISDIR(st.st_mode):
            return -1
        if dev is not None and st.st_dev != dev:
            raise _mount_point(self._path(name))
        mode = stat.S_IMODE(st.st_mode) | stat.S_IRWXU
        try:
            os.chmod(name, mode, dir_fd=parent, follow_symlinks=False)
            return os.open(name, DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            return -1
        except OSError as e:
            raise error_at(e, self._path(name), "making a directory removable") from e
        except (NotImplementedError, ValueError) as e:  # a symlink now, or no lchmod here
            raise OSError(
                errno.EOPNOTSUPP, f"{e} (making a directory removable)", self._path(name)
            ) from e

    def _clear(self) -> list[str]:
        """Unlink every entry but the subdirectories of the directory the removal is
        in; return those."""
        try:
            with os.scandir(self.fd) as it:
                entries = [(d.name, d.is_dir(follow_symlinks=False)) for d in it]
        except FileNotFoundError:
            return []  # another remover removed it
        except OSError as e:
            raise error_at(e, self._path(), "listing a directory") from e
        subdirs = [name for name, is_dir in entries if is_dir]
        for name, is_dir in entries:
            if not is_dir and self._unlink(self.fd, name):
                subdirs.append(name)  # replaced by a directory meanwhile
        return subdirs

    def _unlink(self, parent: int, name: str) -> bool:
        """Unlink ``name`` of ``parent`` (gone already is fine); True if it is a
        directory."""
        try:
            os.unlink(name, dir_fd=parent)
            self.removed += 1
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            return True
        except OSError as e:
            raise error_at(e, self._path(name), "removing") from e
        return False

    def _path(self, name: str = "") -> str:
        """The path of ``name`` in the directory the removal is in (of that directory
        if no ``name``; of the top before it is open), for messages."""
        if not self.frames:
            return self.where.real
        return path_of(self.where.real, [f.name for f in self.frames[1:]], name)

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _identity_of(where: Where) -> tuple[int, int] | None:
    """The identity of entry ``where`` (not followed), None if it is gone."""
    try:
        st = os.stat(where.name, dir_fd=where.fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise error_at(e, where.real, "lstat") from e
    return st.st_dev, st.st_ino


def _mount_point(path: str) -> OSError:
    return OSError(
        errno.EXDEV, "a mount point inside a tree being removed; nothing under it was removed", path
    )
