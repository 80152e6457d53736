"""Publishing a complete staging directory as the target, for every writer of a
checkpoint tree (``core.writer``'s chunks, node storage's incremental store): a
fresh target in one rename, an existing one merged (``core.merge``) and swapped in
(``Staging.swap``). Hold the target's publish lock around ``publish``. Plain Python.
"""

from __future__ import annotations

import errno
import os
import stat

from air_transfer.core.manifest import Manifest
from air_transfer.core.merge import build_merged, check_merge
from air_transfer.core.names import under
from air_transfer.core.staging import Site, Staging


def check_before_writing(manifest: Manifest, site: Site, target: str) -> None:
    """Refuse a merge that cannot be done (``check_merge``) before anything is written.

    The walk takes no lock, so another writer may swap the target meanwhile and
    remove the tree it replaced, under the walk: entries vanish (FileNotFoundError)
    or the walk stops (ESTALE). Then the target is walked again holding the publish
    lock, where no writer swaps it: concurrent writers each publish a whole version,
    one at a time, and never fail on another one's swap."""
    if not existing_target(target):
        return
    try:
        check_merge(manifest, target)
        return
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ESTALE):
            raise
    with site.publish_lock():
        site.recover_locked()
        if existing_target(target):
            check_merge(manifest, target)


def existing_target(target: str) -> bool:
    """Whether ``target`` exists (then it must be a directory the swap can replace)."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise not_a_directory(target)
    # stat, not lstat: the parent may be named by a symlink to it (/proc/self/fd/N).
    if os.stat(os.path.dirname(target)).st_dev != st.st_dev:
        raise OSError(
            errno.EXDEV,
            "checkpoint target is a mount point, which cannot be replaced atomically; "
            "write into a directory inside it",
            target,
        )
    return True


def not_a_directory(target: str) -> NotADirectoryError:
    return NotADirectoryError(
        errno.ENOTDIR,
        "checkpoint target exists and is not a directory; remove it or choose another",
        target,
    )


def publish(manifest: Manifest, staging: Staging, target: str) -> None:
    """Put the staging in place (hold the publish lock)."""
    if not os.path.lexists(target):
        finish_dirs(manifest, staging.path)
        try:
            os.rename(staging.path, target)
            return
        except OSError as e:  # made meanwhile, not by air-transfer: merge into it
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        open_dirs(manifest, staging.path)
    existing_target(target)
    build_merged(manifest, target, staging.path)
    finish_dirs(manifest, staging.path)
    staging.swap()


def finish_dirs(manifest: Manifest, root: str) -> None:
    """Directory modes and mtimes last, deepest first: writing inside a directory
    changes its mtime, and a read-only mode would stop the writes."""
    for e in reversed(manifest.entries):
        if e.kind == "dir":
            path = under(root, e.path)
            os.chmod(path, e.mode)
            os.utime(path, ns=(e.mtime_ns, e.mtime_ns))


def open_dirs(manifest: Manifest, root: str) -> None:
    """Undo ``finish_dirs``'s modes, so that more entries can be written."""
    for e in manifest.entries:
        if e.kind == "dir":
            os.chmod(under(root, e.path), 0o700)
