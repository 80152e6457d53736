"""Node storage, the storage-node side: what writers left behind under a root, found
and removed (``air-transfer clean``).

The library removes most of it itself: a listing of a directory removes the staging
its dead writers left there (``tree.reclaim``), a failed upload removes its file. What
stays: staging in directories nobody lists again, the file of an upload whose writer
or agent died, the trash of a delete cut short. This walks the whole tree under the
root (through directory descriptors, never following a symlink, as ``tree`` does) and
judges each hidden entry by what proves its writer gone:

- ``staging``, ``staging-lock``, ``publish-lock``: the writer's lock, taken only if its
  holder is dead (``core.staging.reclaim_dead``, the library's own reclaim: never a
  live writer's, whatever its host or pid namespace).
- ``trash``: a directory a delete renamed out of the way is deleted already; removing
  it finishes that delete (a deleter still at it and this walk only remove entries,
  and each skips what the other removed: ``tree.remove_tree``).
- ``upload``: carries no lock (its writer may be on another node), so one neither
  written to nor linked for ``upload_age_s`` is taken as abandoned; an upload stream
  idle that long would then fail at ``close()``, with nothing stored half-written.
- ``set-aside``: a swap a writer left half done; kept, for its target's next writer
  to finish or roll back (``core.staging.Site.recover_locked``).

Runs where the files are (a task pinned to the storage node), in a process that holds
no lock of its own. Plain Python.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass, field

from air_transfer.core.confine import Raced, Where, at, open_listable
from air_transfer.core.staging import internal_kind, reclaim_dead
from air_transfer.storage.server.tree import remove_tree

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


@dataclass
class _Frame:
    fd: int
    rel: str  # its path from the root, "" for the root, else ending in "/"
    subdirs: list[str] = field(default_factory=list)


def clean_tree(
    root: str, *, dry_run: bool = False, upload_age_s: float = UPLOAD_AGE_S
) -> list[Leftover]:
    """Every hidden entry the library made under ``root``, each judged (see the
    module) and, unless ``dry_run``, removed where its writer is proven gone."""
    if upload_age_s < 0:
        raise ValueError(f"upload_age_s must be >= 0, got {upload_age_s}")
    found: list[Leftover] = []

    def walk(w: Where) -> None:
        stack = [_Frame(open_listable(w), "")]
        try:
            stack[0].subdirs = _clean_dir(stack[0], w.real, dry_run, upload_age_s, found)
            while stack:
                frame = stack[-1]
                if not frame.subdirs:
                    os.close(stack.pop().fd)
                    continue
                name = frame.subdirs.pop()
                try:
                    fd = open_listable(Where(frame.fd, name, name))
                except (FileNotFoundError, NotADirectoryError, Raced):
                    continue  # gone, or no longer a directory, since it was listed
                stack.append(_Frame(fd, f"{frame.rel}{name}/"))
                stack[-1].subdirs = _clean_dir(stack[-1], w.real, dry_run, upload_age_s, found)
        finally:
            for frame in stack:
                os.close(frame.fd)

    at(root, "", walk)
    return sorted(found, key=lambda leftover: leftover.path)


def _clean_dir(
    frame: _Frame, real: str, dry_run: bool, upload_age_s: float, found: list[Leftover]
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
    total = 0
    try:
        top = open_listable(Where(fd, name, name))
    except (FileNotFoundError, NotADirectoryError, Raced):
        return 0
    stack = [top]
    try:
        while stack:
            current = stack.pop()
            try:
                with os.scandir(current) as it:
                    for d in it:
                        try:
                            st = d.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        if stat.S_ISDIR(st.st_mode):
                            try:
                                stack.append(open_listable(Where(current, d.name, d.name)))
                            except (FileNotFoundError, NotADirectoryError, Raced):
                                continue
                        else:
                            total += st.st_size
            finally:
                os.close(current)
    finally:
        for left in stack:
            os.close(left)
    return total
