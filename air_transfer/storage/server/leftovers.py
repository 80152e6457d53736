"""Node storage, the storage-node side: what writers left behind under a root, found
and removed (``air-transfer clean``).

The library removes most of it itself: a listing of a directory removes the staging
its dead writers left there (``tree.reclaim``), a failed upload removes its file. What
stays: staging in directories nobody lists again, the file of an upload whose writer
or agent died, the trash of a delete cut short. This walks the whole tree under the
root (``core.dirtree.walk_dirs``, as ``tree`` does: through directory descriptors,
never following a symlink) and judges each hidden entry by what proves its writer gone:

- ``staging``, ``staging-lock``, ``publish-lock``: the writer's lock, taken only if its
  holder is dead (``core.staging.reclaim_dead``, the library's own reclaim: never a
  live writer's, whatever its host or pid namespace).
- ``trash``: a directory a delete renamed out of the way is deleted already; removing
  it finishes that delete (a deleter still at it and this walk only remove entries,
  and each skips what the other removed: ``core.tree_removal.remove_tree``).
- ``upload``: carries no lock (its writer may be on another node), so one neither
  written to nor linked for ``upload_age_s`` is taken as abandoned; an upload stream
  idle that long would then fail at ``close()``, with nothing stored half-written.
- ``set-aside``: a swap a writer left half done; kept, for its target's next writer
  to finish or roll back (``core.staging.Site.recover_locked``).

Runs where the files are (a task pinned to the storage node), in a process that holds
no lock of its own. Plain Python.
"""

from __future__ import annotations

import math
import os
import stat
import time
from dataclasses import dataclass

from air_transfer.core.confine import Where, at, open_listable
from air_transfer.core.dirtree import Level, open_dir_or_none, walk_dirs
from air_transfer.core.internal_names import internal_kind
from air_transfer.core.staging import reclaim_dead
from air_transfer.core.tree_removal import remove_tree

#: Seconds an upload file must have been left untouched before it is removed.
UPLOAD_AGE_S = 3600.0


@dataclass(frozen=True)
class Leftover:
    """One hidden entry: its path relative to the root, its kind (see the module),
    its size in bytes (a directory's: the files in it), and what was done:
    ``removed``, ``would remove`` (a dry run), ``kept: <why>`` or ``failed: <error>``."""

    path: str
    kind: str
    nbytes: int
    action: str


def clean_tree(
    root: str, *, dry_run: bool = False, upload_age_s: float = UPLOAD_AGE_S
) -> list[Leftover]:
    """Every hidden entry the library made under ``root``, each judged (see the
    module) and, unless ``dry_run``, removed where its writer is proven gone."""
    if not math.isfinite(upload_age_s) or upload_age_s < 0:
        raise ValueError(f"upload_age_s must be a finite number >= 0, got {upload_age_s}")
    found: list[Leftover] = []

    def walk(w: Where) -> None:
        walk_dirs(
            Level(open_listable(w), -1, "", ""),
            lambda level: _clean_dir(level, w.real, dry_run, upload_age_s, found),
        )

    at(root, "", walk)
    return sorted(found, key=lambda leftover: leftover.path)


def _clean_dir(
    frame: Level, real: str, dry_run: bool, upload_age_s: float, found: list[Leftover]
) -> list[str]:
    """Judge the hidden entries of one directory; return its subdirectories (the
    user's, not symlinks) for the walk."""
    subdirs, hidden = [], {}
    with os.scandir(frame.fd) as it:
        for d in it:
            kind = internal_kind(d.name)
            if kind is not None:
                hidden[d.name] = kind
            elif d.is_dir(follow_symlinks=False):
                subdirs.append(d.name)
    if not hidden:
        return subdirs
    sizes = {name: _size(frame.fd, name) for name in hidden}
    failed: dict[str, str] = {}

    def remove(name: str) -> None:
        try:
            remove_tree(Where(frame.fd, name, name))
        except OSError as e:
            failed[name] = f"{type(e).__name__}: {e}"

    where = os.path.join(real, frame.rel)
    gone = set(reclaim_dead(frame.fd, where, list(hidden), remove, dry_run=dry_run))
    now = time.time()
    for name, kind in sorted(hidden.items()):
        if kind in ("staging", "staging-lock", "publish-lock"):
            action = _done(dry_run) if name in gone else "kept: its writer is alive"
        elif kind == "trash":
            action = _done(dry_run)
            if not dry_run:
                remove(name)
        elif kind == "upload":
            action = _upload(frame.fd, name, now, upload_age_s, dry_run, failed)
        else:
            action = "kept: a swap left half done; its target's next write settles it"
        if name in failed:
            action = f"failed: {failed[name]}"
        found.append(Leftover(f"{frame.rel}{name}", kind, sizes[name], action))
    return subdirs


def _upload(
    fd: int, name: str, now: float, age_s: float, dry_run: bool, failed: dict[str, str]
) -> str:
    """Remove the upload file ``name`` if untouched for ``age_s`` seconds (its ctime
    too: a staging file linked to stored bytes keeps their mtime)."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return "kept: committed or removed by its writer meanwhile"
    idle = now - max(st.st_mtime, st.st_ctime)
    if idle < age_s:
        return f"kept: written to {idle:.0f} s ago (an upload in progress?)"
    if not dry_run:
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            return "kept: committed or removed by its writer meanwhile"
        except OSError as e:
            failed[name] = f"{type(e).__name__}: {e}"
    return _done(dry_run)


def _done(dry_run: bool) -> str:
    return "would remove" if dry_run else "removed"


def _size(fd: int, name: str) -> int:
    """Bytes of the file ``name`` of directory ``fd``, or of the files under it."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    sizes: list[int] = []

    def add(level: Level) -> list[str]:
        subdirs = []
        with os.scandir(level.fd) as it:
            for d in it:
                try:
                    st = d.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(d.name)
                else:
                    sizes.append(st.st_size)
        return subdirs

    top = open_dir_or_none(fd, name)
    if top is not None:
        walk_dirs(Level(top, fd, name, ""), add)
    return sum(sizes)
