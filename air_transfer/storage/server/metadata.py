"""Node storage, the storage-node side: metadata operations on this node's disk.

Runs in the agent of the storage node (``node_service.NodeStorageService`` hands its calls to
these methods): every metadata operation of ``storage_filesystem`` is one call to one of
them (file bodies: ``uploads``, ``reads``). They keep no state between
calls, and the agent runs up to 32 of them at once, for callers on every node.

So no operation checks and then acts: each acts and reads the outcome from the
system call (``mkdir`` then ``EEXIST``, ``rename`` then ``ENOENT``), and what several
callers do at once ends as some order of the same calls one after the other would.
Concurrent ``create_dir`` of one path all succeed; of concurrent ``delete_dir`` (or
``delete_file``, ``move``) of one path exactly one succeeds and the others raise
FileNotFoundError, as with pyarrow's ``LocalFileSystem``. Where ``LocalFileSystem``
itself trips over a concurrent change (an entry deleted by another caller during its
``delete_dir_contents`` or a recursive listing raises FileNotFoundError), these give
the outcome of some serial order instead.

Every path is confined to the root by ``confine.at`` (no symlink leads out, even one
made while the operation runs). Errors are the built-in ``OSError`` subclasses a
local pyarrow filesystem raises, naming the path. Plain Python: unit-tested without
Ray.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from air_transfer.core.confine import (
    Raced,
    Where,
    at,
    checked_path,
    is_symlink,
    open_listable,
    oserror,
    storage_path,
)
from air_transfer.core.internal_names import REPLICA_MARK, is_internal
from air_transfer.core.tree_removal import remove_tree
from air_transfer.storage.node_wire import Info
from air_transfer.storage.server.tree import (
    NOT_FOUND,
    STAGING_MARK,
    TRASH_MARK,
    UNKNOWN,
    hidden_name,
    list_tree,
    to_info,
)

__all__ = ["STAGING_MARK", "DiskStorage", "Info", "checked_path", "oserror", "storage_path"]


class DiskStorage:
    """The node-side half of ``storage_filesystem``: operations on this node's disk."""

    def fs_info(self, root: str, paths: list[str]) -> list[Info]:
        return [info(root, p) for p in paths]

    def fs_list(
        self, root: str, base: str, recursive: bool, allow_not_found: bool
    ) -> list[tuple[str, int, int | None, int | None]]:
        """``(relative path, type, size, mtime_ns)`` of what is under ``base``."""
        try:
            if internal(root, base):
                raise oserror(FileNotFoundError, errno.ENOENT, base)
            found, links = at(root, base, lambda w: list_tree(open_listable(w), recursive, w.real))
        except NotADirectoryError as e:
            raise oserror(NotADirectoryError, errno.ENOTDIR, base, ": cannot list it") from e
        except FileNotFoundError:
            if allow_not_found:
                return []
            raise
        for i in links:  # a symlink is what its target is, if that is inside the root
            rel, *_ = found[i]
            try:
                found[i] = (rel, *info(root, posixpath.join(storage_path(root, base), rel)))
            except PermissionError:
                found[i] = (rel, *UNKNOWN)
        return [entry for entry in found if entry[1] != NOT_FOUND[0]]

    def fs_create_dir(self, root: str, path: str, recursive: bool) -> None:
        def make(w: Where) -> None:
            try:
                os.mkdir(w.name, 0o777, dir_fd=w.fd)
                return
            except FileExistsError:
                pass  # made meanwhile by another caller, or a file
            except FileNotFoundError:
                if recursive:  # its parent was deleted since the walk: walk again
                    raise Raced from None
                raise
            try:
                st = os.stat(w.name, dir_fd=w.fd, follow_symlinks=False)
            except FileNotFoundError:
                raise Raced from None  # deleted again meanwhile: try again
            if is_symlink(st):
                raise Raced
            if not stat.S_ISDIR(st.st_mode):
                raise oserror(FileExistsError, errno.EEXIST, w.name, " (not a directory)")

        at(root, path, make, make_parents=recursive)

    def fs_delete_dir(self, root: str, path: str) -> None:
        """Rename the directory to a hidden name in its parent (atomic: of concurrent
        deletions, one wins), then remove it at leisure."""

        def delete(w: Where) -> None:
            st = os.stat(w.name, dir_fd=w.fd, follow_symlinks=False)
            if is_symlink(st):  # as LocalFileSystem: the link goes, not its target
                os.unlink(w.name, dir_fd=w.fd)
                return
            if not stat.S_ISDIR(st.st_mode):
                raise oserror(NotADirectoryError, errno.ENOTDIR, w.name, ": not a directory")
            trash = hidden_name(w.name, TRASH_MARK)
            try:
                os.rename(w.name, trash, src_dir_fd=w.fd, dst_dir_fd=w.fd)
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.EXDEV):  # a mount point: in place
                    raise
                trash = w.name
            remove_tree(Where(w.fd, trash, w.real))

        at(root, path, delete, follow=False)

    def fs_delete_dir_contents(self, root: str, path: str, missing_dir_ok: bool) -> None:
        def clear(w: Where) -> None:
            if w.real == "/":
                raise PermissionError(errno.EACCES, "the contents of '/'; refused", path)
            fd = open_listable(w)
            try:
                with os.scandir(fd) as it:
                    # A trash entry is a directory another caller is already
                    # deleting: renaming it again would only make its name grow. A
                    # replica's marker says what the directory is, not what it holds.
                    names = [
                        (d.name, d.is_dir(follow_symlinks=False))
                        for d in it
                        if TRASH_MARK not in d.name and not d.name.startswith(REPLICA_MARK)
                    ]
                for name, is_dir in names:
                    if is_dir:
                        _delete_subdir(fd, name, w.real)
                    else:
                        _unlink_if_there(fd, name, w.real)
            finally:
                os.close(fd)

        try:
            at(root, path, clear)
        except FileNotFoundError:
            if not missing_dir_ok:
                raise

    def fs_delete_file(self, root: str, path: str) -> None:
        at(root, path, lambda w: os.unlink(w.name, dir_fd=w.fd), follow=False)

    def fs_move(self, root: str, src: str, dest: str) -> None:
        def move(s: Where) -> None:
            def to(d: Where) -> None:
                try:
                    os.rename(s.name, d.name, src_dir_fd=s.fd, dst_dir_fd=d.fd)
                except OSError as e:
                    raise type(e)(e.errno, e.strerror, src, None, dest) from e

            at(root, dest, to, follow=False)

        at(root, src, move, follow=False)


def internal(root: str, path: str) -> bool:
    """Whether ``path`` names something the library made (staging, a lock, trash) or
    lies inside one: listings and infos do not show those (``internal_names.is_internal``)."""
    top, full = storage_path("/", root), storage_path(root, path)
    rel = full[len(top) :] if top != "/" else full
    return any(is_internal(part) for part in rel.split("/"))


def info(root: str, path: str) -> Info:
    """What ``path`` is now (following a symlink inside the root); not found for the
    names the library makes (``internal``)."""
    if internal(root, path):
        return NOT_FOUND

    def look(w: Where) -> Info:
        try:
            st = os.stat(w.name, dir_fd=w.fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return NOT_FOUND
        if is_symlink(st):
            raise Raced
        return to_info(st)

    try:
        return at(root, path, look)
    except (FileNotFoundError, NotADirectoryError):
        return NOT_FOUND  # a directory on the way is missing, or is a file
    except OSError as e:
        if e.errno == errno.ELOOP:  # as LocalFileSystem: a symlink loop is not found
            return NOT_FOUND
        raise


def _delete_subdir(fd: int, name: str, real: str) -> None:
    """Delete subdirectory ``name`` of the open directory ``fd`` (in ``real``) as
    ``fs_delete_dir`` does; one already gone was deleted by another caller: fine."""
    trash = hidden_name(name, TRASH_MARK)
    try:
        os.rename(name, trash, src_dir_fd=fd, dst_dir_fd=fd)
    except FileNotFoundError:
        return
    except OSError as e:
        if e.errno not in (errno.EBUSY, errno.EXDEV):
            raise
        trash = name
    remove_tree(Where(fd, trash, posixpath.join(real, name)))


def _unlink_if_there(fd: int, name: str, real: str) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    except IsADirectoryError:  # replaced by a directory meanwhile
        _delete_subdir(fd, name, real)
