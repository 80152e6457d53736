"""Node storage, the storage-node side: listing directory trees, and the names and
infos of what is listed.

The walk goes through directory fds (``dir_fd=``), never following a symlink, so a
tree cannot lead out of the storage root while it is walked; and it loops over an
explicit stack (``core.dirtree.walk_dirs``), since a tree can be deeper than Python's
recursion limit (1,200+ levels). Trees are removed by ``core.tree_removal.remove_tree``.

Other callers work in the same directories at the same time (the agent runs 32
threads; Ray Train's workers report at once), so what is seen may change under the
walk: an entry that vanishes is skipped, as a listing taken a moment later would not
show it. Plain Python.
"""

from __future__ import annotations

import logging
import os
import posixpath
import stat
import uuid

import pyarrow.fs as pafs

from air_transfer.core.confine import Where
from air_transfer.core.dirtree import Level, walk_dirs
from air_transfer.core.internal_names import (
    TRASH_MARK as TRASH_MARK,  # marks a directory being deleted
)
from air_transfer.core.internal_names import UPLOAD_MARK, internal_name, is_internal
from air_transfer.core.staging import reclaim_dead
from air_transfer.core.tree_removal import remove_tree
from air_transfer.storage.node_wire import Info

logger = logging.getLogger(__name__)

#: Marks the staging files of uploads in progress (``storage.server.uploads``).
STAGING_MARK = UPLOAD_MARK

NOT_FOUND: Info = (pafs.FileType.NotFound, None, None)
#: A symlink whose target is outside the root: it exists, but is not served.
UNKNOWN: Info = (pafs.FileType.Unknown, None, None)


def hidden_name(name: str, mark: str) -> str:
    """A fresh hidden name for something made next to ``name`` (within NAME_MAX,
    whatever the length of ``name``: ``internal_names.internal_name``)."""
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
