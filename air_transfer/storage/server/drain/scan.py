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
from air_transfer.core.staging import is_internal
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
    """Every regular file and every directory without files under ``root``, each
    directory opened confined to the root (``core.confine``): one swapped for a
    symlink meanwhile is never followed out of it."""
    files: dict[str, Seen] = {}
    empty: set[str] = set()
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        names = _names(root, rel_dir)
        if names is None:
            continue  # deleted or replaced meanwhile: the next pass sees what is there
        holds_file = False
        for rel, st in names:
            if stat.S_ISDIR(st.st_mode):
                pending.append(rel)
                holds_file = True  # not empty; its own emptiness is judged on its own
            elif stat.S_ISREG(st.st_mode):
                files[rel] = Seen.of(rel, st)
                holds_file = True
        if rel_dir and not holds_file:
            empty.add(rel_dir)
    return Scanned(files, empty)


def _names(root: str, rel_dir: str) -> list[tuple[str, os.stat_result]] | None:
    try:
        fd = at(root, storage_path(root, rel_dir), open_listable)
    except OSError:  # gone, replaced by a file, a link out of the root, a loop
        return None
    out = []
    try:
        for entry in os.scandir(fd):
            if is_internal(entry.name):
                continue
            try:
                st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            out.append((f"{rel_dir}/{entry.name}" if rel_dir else entry.name, st))
    finally:
        os.close(fd)
    return out


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
    too large to hold (``LAST_FILE_MAX_BYTES``), uploaded last as they are then."""
    out, big = [], []
    for rel, seen in scan_storage(root).files.items():
        if not settings.is_last(rel):
            continue
        if seen.size > LAST_FILE_MAX_BYTES:
            big.append(seen)
            continue
        try:
            fd, st = open_regular(root, storage_path(root, rel))
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            content = os.pread(fd, st.st_size, 0)
            now = Seen.of(rel, os.fstat(fd))
        finally:
            os.close(fd)
        if len(content) == now.size:
            out.append((now, content))
    return out, big
