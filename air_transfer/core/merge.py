"""Merging a checkpoint into an existing target: the merged tree is built in staging.

Why not replace the target's files one by one (``os.replace`` per file, what
``ray.train.Checkpoint.to_directory`` does): a writer killed half way leaves a target
that is neither version (19,995 old and 5 new files, in one test). Instead the
staging directory, which already holds the checkpoint's entries, receives every
entry of the target that the checkpoint does not replace: files (and symlinks, and
any other non-directory) as hard links, so nothing is copied (a copy where links are
refused), directories recreated with their mode and mtime. The staging then *is* the
merged tree, and ``Staging.swap`` puts it in place in one step.

The target is read as it is on disk, never trusted from the manifest: a walk by
``lstat`` that follows no symlink collects every link there, and the merged tree's links
are resolved together (``air_transfer.core.links``). A merge that would leave a link
resolving outside the target is refused, as is one that turns a directory into a file or
a symlink or back (writing ``a/b`` where ``a`` is a symlink would follow it). Links that
already led outside before the merge are the owner's and stay; no link of the checkpoint
may lead through them.

Plain Python: unit-tested without Ray.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from air_transfer.core.dirtree import DirCursor, Visit, walk
from air_transfer.core.links import escaping_links
from air_transfer.core.manifest import Manifest
from air_transfer.errors import ManifestError, error_at

#: ``link`` errors that mean "not here", where a copy does the job: no hard links on
#: this filesystem, a file at its link limit, protected_hardlinks. (EXDEV is not one:
#: the staging is next to the target, so it means a mount inside the target.)
_LINK_REFUSED = frozenset({errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP})


def check_merge(manifest: Manifest, target: str) -> None:
    """Refuse, before anything is written, a merge into ``target`` that would change a
    path's kind (FileExistsError) or leave a link leading out of it (ManifestError)."""
    _check_links(manifest, target, _walk(manifest, target, None)[0])


def build_merged(manifest: Manifest, target: str, staging: str) -> None:
    """Bring every entry of ``target`` that ``manifest`` does not replace into
    ``staging`` (which holds the manifest's entries), then check the merged tree as
    ``check_merge`` does. The staging root takes the target root's mode."""
    links, mode = _walk(manifest, target, staging)
    _check_links(manifest, target, links)
    os.chmod(staging, stat.S_IMODE(mode))


def _walk(manifest: Manifest, target: str, staging: str | None) -> tuple[dict[str, str], int]:
    """Walk ``target`` (mirroring it into ``staging`` if given); returns its links, and
    the mode of the directory walked (not of whatever ``target`` names by then)."""
    links: dict[str, str] = {}
    with DirCursor(target) as there, contextlib.ExitStack() as stack:
        here = stack.enter_context(DirCursor(staging)) if staging is not None else None
        top = os.fstat(there.fd)
        device = top.st_dev
        for v in walk(there):
            entry = manifest.entry(v.relpath) if v.relpath in manifest else None
            if v.kind == "symlink":
                links[v.relpath] = _readlink(there, v.name)
            if entry is not None and (entry.kind == "dir") != (v.kind == "dir"):
                raise _kind_clash(target, v.relpath, v.kind == "dir", entry.kind)
            if v.st.st_dev != device:
                raise _mount_inside(os.path.join(target, *v.relpath.split("/")))
            if here is not None:
                _mirror(v, entry is None, there, here)
    return links, top.st_mode


def _mirror(v: Visit, keep: bool, there: DirCursor, here: DirCursor) -> None:
    """Follow the walk of the target in staging, bringing in what it ``keep``s."""
    try:
        if v.event == "enter":
            if keep:
                os.mkdir(v.name, 0o700, dir_fd=here.fd)
            here.down(v.name)
        elif v.event == "leave":
            here.up()
            if keep:  # after its entries: they change its mtime
                os.chmod(v.name, stat.S_IMODE(v.st.st_mode), dir_fd=here.fd)
                os.utime(v.name, ns=(v.st.st_atime_ns, v.st.st_mtime_ns), dir_fd=here.fd)
        elif keep:
            _link_or_copy(v, there, here)
    except OSError as e:
        if e.filename is not None and os.path.isabs(os.fsdecode(e.filename)):
            raise
        raise error_at(e, here.where(v.name), "building the merged tree") from e


def _link_or_copy(v: Visit, there: DirCursor, here: DirCursor) -> None:
    try:
        os.link(v.name, v.name, src_dir_fd=there.fd, dst_dir_fd=here.fd, follow_symlinks=False)
        return
    except OSError as e:
        if e.errno == errno.EXDEV:  # a bind mount of the same device
            raise _mount_inside(there.where(v.name)) from e
        if e.errno not in _LINK_REFUSED or v.kind not in ("file", "symlink"):
            raise error_at(e, there.where(v.name), "hard-linking it into the merged tree") from e
    times = (v.st.st_atime_ns, v.st.st_mtime_ns)
    if v.kind == "symlink":
        os.symlink(_readlink(there, v.name), v.name, dir_fd=here.fd)
        os.utime(v.name, ns=times, dir_fd=here.fd, follow_symlinks=False)
        return
    src = os.open(v.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=there.fd)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        dst = os.open(v.name, flags, 0o600, dir_fd=here.fd)
        try:
            while os.sendfile(dst, src, None, 1 << 30):
                pass
            os.fchmod(dst, stat.S_IMODE(v.st.st_mode))
            os.utime(dst, ns=times)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _readlink(cursor: DirCursor, name: str) -> str:
    try:
        return os.readlink(name, dir_fd=cursor.fd)
    except OSError as e:
        raise error_at(e, cursor.where(name), "reading a symlink") from e


def _check_links(manifest: Manifest, target: str, on_disk: dict[str, str]) -> None:
    ours = {e.path: e.target or "" for e in manifest.entries if e.kind == "symlink"}
    merged = {p: t for p, t in on_disk.items() if p not in manifest}
    merged.update(ours)
    bad = escaping_links(merged)
    theirs = [p for p in bad if p not in ours]
    if theirs:  # led outside before this merge already: the owner's, left alone
        already = set(escaping_links(on_disk, theirs))
        bad = [p for p in bad if p not in already]
    if not bad:
        return
    path = bad[0]
    origin = "of the checkpoint" if path in ours else "already in the target"
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    raise ManifestError(
        f"merging the checkpoint into {target!r} would leave the symlink {path!r} -> "
        f"{merged[path]!r} ({origin}){more} resolving outside the target, through the "
        "links on disk and in the checkpoint; nothing was written. Remove the link or "
        "write into an empty directory"
    )


def _kind_clash(target: str, relpath: str, is_dir: bool, kind: str) -> FileExistsError:
    there = "a directory" if is_dir else "a file or symlink"
    return FileExistsError(
        errno.EEXIST,
        f"cannot merge checkpoint into {target!r}: {relpath!r} is {there} there but a "
        f"{kind} in the checkpoint; remove it or choose another target",
        os.path.join(target, *relpath.split("/")),
    )


def _mount_inside(path: str) -> OSError:
    return OSError(
        errno.EXDEV,
        "a mount point inside the target cannot be carried into the merged tree that "
        "replaces it atomically; unmount it or write into an empty directory",
        path,
    )
