"""Node storage, the storage-node side: walking and removing directory trees.

Both go through directory fds (``dir_fd=``), never following a symlink, so a tree
cannot lead out of the storage root while it is walked; and both loop over an explicit
stack, since a tree can be deeper than Python's recursion limit (1,200+ levels).

Other callers work in the same directories at the same time (the agent runs 32
threads; Ray Train's workers report at once), so what is seen may change under the
walk: an entry that vanishes is skipped, as a listing taken a moment later would not
show it; an entry that appears inside a tree being removed is removed too (a few
rounds, then ``ENOTEMPTY``). Plain Python.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import stat
import uuid

import pyarrow.fs as pafs

from air_transfer.cluster.agent_client import Info
from air_transfer.core.confine import Raced, Where, open_listable, oserror
from air_transfer.core.dirtree import Level, walk_dirs
from air_transfer.core.staging import TRASH_MARK as TRASH_MARK  # marks a directory being deleted
from air_transfer.core.staging import UPLOAD_MARK, internal_name, is_internal, reclaim_dead

logger = logging.getLogger(__name__)

#: Marks the staging files of uploads in progress (``disk_uploads``).
STAGING_MARK = UPLOAD_MARK
#: How often a directory that keeps filling up while it is removed is emptied again.
ROUNDS = 4

NOT_FOUND: Info = (pafs.FileType.NotFound, None, None)
#: A symlink whose target is outside the root: it exists, but is not served.
UNKNOWN: Info = (pafs.FileType.Unknown, None, None)


def hidden_name(name: str, mark: str) -> str:
    """A fresh hidden name for something made next to ``name`` (within NAME_MAX,
    whatever the length of ``name``: ``staging.internal_name``)."""
    return internal_name(name, mark, uuid.uuid4().hex)


def to_info(st: os.stat_result) -> Info:
    if stat.S_ISDIR(st.st_mode):
        return (pafs.FileType.Directory, None, st.st_mtime_ns)
    if stat.S_ISREG(st.st_mode):
        return (pafs.FileType.File, st.st_size, st.st_mtime_ns)
    return (pafs.FileType.Unknown, None, st.st_mtime_ns)


def list_tree(
    top: int, recursive: bool, real: str
) -> tuple[list[tuple[str, int, int | None, int | None]], list[int]]:
    """``(relative path, type, size, mtime_ns)`` of what is under the open directory
    ``top`` (closed here; its real path is ``real``), and the indices of the symlinks
    among them: they carry ``UNKNOWN`` here, for the caller to resolve within the
    root. Symlinked directories are not descended into (a link to an ancestor would
    loop). The names the library makes (staging, locks, trash) are left out, and what
    dead writers left in a directory listed is removed (``reclaim``)."""
    out: list[tuple[str, int, int | None, int | None]] = []
    links: list[int] = []
    walk_dirs(
        Level(top, -1, "", ""),
        lambda level: _scan(level.fd, real, level.rel, recursive, out, links),
    )
    return out, links


def remove_tree(where: Where) -> None:
    """Remove the directory ``where`` and everything in it (see the module)."""
    fd = _open_or_unlink(where.fd, where.name)
    if fd is not None:
        walk_dirs(Level(fd, where.fd, where.name, ""), _clear, _rmdir, _open_or_unlink)


def _clear(level: Level) -> list[str]:
    return clear_files(level.fd)


def _rmdir(level: Level) -> list[str] | None:
    """Remove the emptied directory ``level``; None once it is gone, else what
    appeared in it meanwhile (its files removed: its subdirectories to empty)."""
    try:
        os.rmdir(level.name, dir_fd=level.parent)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        if level.rounds >= ROUNDS:
            detail = " (it kept filling up while being deleted)"
            raise oserror(OSError, e.errno, level.name, detail) from e
        level.rounds += 1
        return clear_files(level.fd)  # entries that appeared meanwhile
    return None


def clear_files(fd: int) -> list[str]:
    """Remove every non-directory entry of the open directory ``fd``; return the
    names of its subdirectories."""
    subdirs = []
    with os.scandir(fd) as it:
        for d in it:
            if d.is_dir(follow_symlinks=False):
                subdirs.append(d.name)
                continue
            try:
                os.unlink(d.name, dir_fd=fd)
            except FileNotFoundError:
                continue
            except IsADirectoryError:  # replaced by a directory meanwhile
                subdirs.append(d.name)
    return subdirs


def _scan(
    fd: int,
    real: str,
    rel: str,
    recursive: bool,
    out: list[tuple[str, int, int | None, int | None]],
    links: list[int],
) -> list[str]:
    """Append the entries of directory ``fd`` (``rel`` under ``real``) to ``out``;
    return its subdirectories (if ``recursive``)."""
    subdirs = []
    internal = []
    with os.scandir(fd) as it:
        for d in it:
            if is_internal(d.name):
                internal.append(d.name)
                continue
            try:
                st = d.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # vanished since it was listed
            if stat.S_ISLNK(st.st_mode):
                links.append(len(out))
                out.append((f"{rel}{d.name}", *UNKNOWN))
                continue
            out.append((f"{rel}{d.name}", *to_info(st)))
            if recursive and stat.S_ISDIR(st.st_mode):
                subdirs.append(d.name)
    if internal:
        reclaim(fd, posixpath.join(real, rel), internal)
    return subdirs


def reclaim(fd: int, real: str, names: list[str]) -> None:
    """Remove the staging (and lock files) that dead writers left among ``names``,
    entries of the open directory ``fd`` at ``real`` (``staging.reclaim_dead``: never
    a live writer's). A failure is logged: a later listing tries again."""

    def remove(name: str) -> None:
        try:
            remove_tree(Where(fd, name, name))
        except OSError as e:
            logger.warning("could not remove %s, left by a writer that died: %s", name, e)

    try:
        reclaim_dead(fd, real, names, remove)
    except OSError as e:
        logger.warning("could not reclaim the staging of dead writers: %s", e)


def _open_or_unlink(parent: int, name: str) -> int | None:
    """Directory ``name`` of ``parent`` opened for listing; None if it vanished or
    is no longer a directory (then removed)."""
    try:
        return open_listable(Where(parent, name, name))
    except FileNotFoundError:
        return None
    except (NotADirectoryError, Raced):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent)
        return None
