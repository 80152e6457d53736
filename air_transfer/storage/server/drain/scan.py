"""What node storage holds now, for the drain: every regular file under the root with
the stamp that tells one version from another, and every directory.

A stored file is never modified in place (every write replaces it, an incremental
save links it whole), so its version is its inode, device, size and mtime; the ctime
and the link count are left out on purpose, since later saves that link the file and
deletes of older checkpoints change them without changing a byte. Symlinks are not
followed and not drained (node storage serves them only inside the root). The
library's own names (staging, locks, trash) are skipped.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from air_transfer.core.confine import Where, at, open_listable, open_regular, storage_path
from air_transfer.core.dirtree import Level, walk_dirs
from air_transfer.core.internal_names import is_internal
from air_transfer.core.placed_mark import is_stub
from air_transfer.storage.durable.settings import LAST_FILE_MAX_BYTES, DrainSettings


@dataclass(frozen=True)
class Seen:
    """One regular file as the scan found it."""

    rel: str
    size: int
    mtime_ns: int
    mode: int
    ino: int
    dev: int

    @property
    def version(self) -> tuple[int, int, int, int]:
        return (self.ino, self.dev, self.size, self.mtime_ns)

    @classmethod
    def of(cls, rel: str, st: os.stat_result) -> Seen:
        return cls(rel, st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode), st.st_ino, st.st_dev)


@dataclass(frozen=True)
class Scanned:
    files: dict[str, Seen]
    #: Directories holding no file (the durable tier makes those explicitly).
    empty_dirs: set[str]


def scan_storage(root: str) -> Scanned:
    """Every regular file and every directory without files under ``root``, walked
    from the root opened confined to it (``core.confine``), each directory opened
    from its parent without following a symlink (``core.dirtree.walk_dirs``): one
    swapped for a symlink meanwhile is never followed out of it. A directory gone or
    replaced meanwhile is skipped: the next pass sees what is there."""
    files: dict[str, Seen] = {}
    empty: set[str] = set()

    def visit(level: Level) -> list[str]:
        subdirs: list[str] = []
        holds_file = False  # a subdirectory counts: its own emptiness is its own
        for name, st in _entries(level.fd):
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(name)
                holds_file = True
            elif stat.S_ISREG(st.st_mode):
                files[level.rel + name] = Seen.of(level.rel + name, st)
                holds_file = True
        if level.rel and not holds_file:
            empty.add(level.rel[:-1])
        return subdirs

    try:
        top = at(root, storage_path(root, ""), open_listable)
    except OSError:  # gone, replaced by a file, a link out of the root, a loop
        return Scanned(files, empty)
    walk_dirs(Level(top, -1, "", ""), visit, open_dir=_open_or_skip)
    return Scanned(files, empty)


def _entries(fd: int) -> list[tuple[str, os.stat_result]]:
    """The names in the open directory ``fd`` but the library's own, each with its
    ``lstat``; one gone since it was listed is left out."""
    out = []
    for entry in os.scandir(fd):
        if is_internal(entry.name):
            continue
        try:
            out.append((entry.name, os.stat(entry.name, dir_fd=fd, follow_symlinks=False)))
        except FileNotFoundError:
            continue
    return out


def _open_or_skip(parent: int, name: str) -> int | None:
    """Subdirectory ``name`` of ``parent`` opened for listing, never through a
    symlink; None if it cannot be (gone, replaced, unreadable): it is skipped."""
    try:
        return open_listable(Where(parent, name, name))
    except OSError:
        return None


def exists(root: str, rel: str) -> bool:
    """Whether node storage holds anything at ``rel`` now (a symlink counts)."""
    if not rel:
        return True

    def look(w: Where) -> bool:
        try:
            os.stat(w.name, dir_fd=w.fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    try:
        return bool(at(root, storage_path(root, rel), look, follow=False))
    except (FileNotFoundError, NotADirectoryError):
        return False


def read_last(root: str, settings: DrainSettings) -> tuple[list[tuple[Seen, bytes]], list[Seen]]:
    """The files uploaded last, read now, before the rest is scanned; and those
    too large to hold (``LAST_FILE_MAX_BYTES``) or held by other nodes (a placed
    file's stub), uploaded last as they are then."""
    out, big = [], []
    for rel, seen in scan_storage(root).files.items():
        if not settings.is_last(rel):
            continue
        if seen.size > LAST_FILE_MAX_BYTES:
            big.append(seen)
            continue
        try:
            fd, st = open_regular(root, storage_path(root, rel), stubs_ok=True)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            if is_stub(fd):  # a placed file's: its bytes are on its holders
                big.append(seen)
                continue
            content = os.pread(fd, st.st_size, 0)
            now = Seen.of(rel, os.fstat(fd))
        finally:
            os.close(fd)
        if len(content) == now.size:
            out.append((now, content))
    return out, big
