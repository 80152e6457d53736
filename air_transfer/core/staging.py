"""Staging directories next to a target, owned through locks, swapped in atomically.

Every name lives in the target's parent, so it is on the target's filesystem (renames
are atomic) and on the same shared volume for every host that writes there:

- ``.<name>.air-lock``: the per-target publish lock. Publishing (and recovery) hold it.
- ``.<name>.air-staging-<id>``: a writer's staging directory, and
  ``.<name>.air-staging-<id>.lock``: the lock its writer holds from before the
  directory exists until after it is gone.
- ``.<name>.air-old-<id>``: the previous target, only for the moment of a swap on a
  filesystem without ``RENAME_EXCHANGE``.

Node storage adds ``.<name>.air-upload-<id>`` (a file being uploaded),
``.<name>.air-trash-<id>`` (a directory being deleted) and, in a replica's root,
``.air-replica`` (which storage and node it is a copy of). How these names are made
and told from the user's: ``core.internal_names``.

**Liveness is a lock, never a pid** (``core.locks``): a staging directory whose lock
can be taken belongs to a dead writer and is removed.

**A target is absent or complete.** A fresh target is one ``rename``. A merge swaps a
complete merged tree in with ``renameat2(RENAME_EXCHANGE)``; where the filesystem
refuses that, with two renames (target -> ``air-old``, staging -> target) that a later
writer finishes or rolls back (``recover``).

Plain Python (Linux for the exchange; elsewhere the two-rename swap): unit-tested
without Ray.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator

from air_transfer.core.exchange import exchange
from air_transfer.core.internal_names import (
    LOCK_SUFFIX,
    OLD,
    PUBLISH_LOCK,
    SET_ASIDE,
    STAGED,
    STAGING,
    SUFFIX,
    internal_name,
    stem,
)
from air_transfer.core.locks import (
    acquire,
    claim,
    dead_lock,
    disown,
    is_dead,
    lock_still_named,
    own,
    process_mutex,
    unlink_lock,
    unused_here,
)
from air_transfer.core.tree_removal import rmtree
from air_transfer.errors import error_at

logger = logging.getLogger(__name__)

#: Written into a staging lock file just before the swap: the staging is complete.
SWAP_MARK = b"swap\n"


class Site:
    """The hidden names next to one target (``parent/name``)."""

    def __init__(self, parent: str, name: str) -> None:
        self.parent, self.name = parent, name
        self.target = os.path.join(parent, name)
        self._stem = stem(name)

    def staging_path(self, suffix: str) -> str:
        return os.path.join(self.parent, internal_name(self.name, STAGING, suffix))

    def lock_path(self, suffix: str) -> str:
        return self.staging_path(suffix) + LOCK_SUFFIX

    def old_path(self, suffix: str) -> str:
        return os.path.join(self.parent, internal_name(self.name, OLD, suffix))

    @contextlib.contextmanager
    def publish_lock(self) -> Iterator[None]:
        """Serialise publishing into this target: threads, processes, and hosts that
        share the volume."""
        path = os.path.join(self.parent, internal_name(self.name, PUBLISH_LOCK))
        with process_mutex(path):
            fd = acquire(path)
            try:
                yield
            finally:
                unlink_lock(path, fd)

    def staging(self) -> Staging:
        return Staging(self)

    def clean_up(self) -> None:
        """What writers of this target that died left: finish or roll back their
        swaps (under the publish lock, taken only if there is one); then remove the
        staging of every dead writer in the parent, of this target or another
        (``reclaim_dead``: Ray Train never writes a checkpoint's name twice)."""
        if self._scan()[1]:
            with self.publish_lock():
                self.recover_locked()
        try:
            fd = os.open(self.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            reclaim_dead(fd, self.parent, os.listdir(fd), self._remove)
        finally:
            os.close(fd)

    def _remove(self, name: str) -> None:
        _remove(os.path.join(self.parent, name))

    def recover_locked(self) -> None:
        """``recover``, the publish lock held: the target comes back complete, the
        merged tree if the dead writer's staging was complete (marked), else the old
        one; what the swap left aside is removed."""
        for suffix in self._scan()[1] - own():
            with dead_lock(self.lock_path(suffix)) as fd:
                if fd is None:
                    continue
                old, staging = self.old_path(suffix), self.staging_path(suffix)
                marked = fd >= 0 and os.pread(fd, len(SWAP_MARK), 0) == SWAP_MARK
                if os.path.lexists(self.target):
                    logger.info("removing the tree a dead writer replaced: %s", old)
                elif marked and os.path.isdir(staging):
                    logger.warning("finishing the swap a dead writer began: %s", self.target)
                    os.rename(staging, self.target)
                else:
                    logger.warning("rolling back the swap a dead writer began: %s", self.target)
                    os.rename(old, self.target)
                _remove(old)
                _remove(staging)

    def _scan(self) -> tuple[set[str], set[str]]:
        """The suffixes of the staging (and lock files) and of the old trees here."""
        found: tuple[set[str], set[str]] = (set(), set())
        with contextlib.suppress(FileNotFoundError):
            for entry in os.listdir(self.parent):
                for mark, suffixes in zip((STAGING, OLD), found, strict=True):
                    prefix = f"{self._stem}{mark}"
                    if entry.startswith(prefix):
                        rest = entry[len(prefix) :].removesuffix(LOCK_SUFFIX)
                        if SUFFIX.fullmatch(rest):
                            suffixes.add(rest)
        return found


def reclaim_dead(
    dir_fd: int,
    where: str,
    names: Iterable[str],
    remove: Callable[[str], None],
    *,
    dry_run: bool = False,
) -> list[str]:
    """Remove what dead writers left, whatever their target, from the open directory
    ``dir_fd`` (at path ``where``) whose entries ``names`` were listed before this
    call: each staging whose lock can be taken (the lock of a dead writer is free:
    any pid, any host), then its lock file; and each free publish lock. Never a live
    writer's (its lock is held, or it is of this process: ``_OWN``, ``_MUTEXES``),
    nor a staging a swap left half done (an ``air-old`` of the same id: only the
    target's next writer can settle it, ``Site.recover_locked``). ``remove(name)``
    removes one staging directory. Returns the names removed: staging directories,
    their lock files, publish locks. ``dry_run``: judge the same way, remove nothing,
    and return what would be removed (``air-transfer clean --dry-run``)."""
    listed = set(names)
    staged: set[tuple[str, str]] = set()
    aside: set[tuple[str, str]] = set()
    publish: list[str] = []
    for name in listed:
        if found := STAGED.fullmatch(name):
            staged.add((found[1], found[2]))
        elif found := SET_ASIDE.fullmatch(name):
            aside.add((found[1], found[2]))
        elif name.startswith(".") and name.endswith(PUBLISH_LOCK):
            publish.append(name)
    removed = []
    for name in sorted(publish):
        with unused_here(os.path.join(where, name)) as unused:
            if not unused:
                continue
            if dry_run:
                if is_dead(name, dir_fd):
                    removed.append(name)
                continue
            with dead_lock(name, dir_fd) as fd:
                if fd is not None and fd >= 0:  # its holder is dead: unlinked on the way out
                    removed.append(name)
    mine = own()  # after the listing: a writer of this process listed there is in it
    for target, suffix in sorted(staged - aside):
        if suffix in mine:
            continue
        name = f"{target}{STAGING}{suffix}"
        lock = name + LOCK_SUFFIX
        if dry_run:
            if is_dead(lock, dir_fd):
                removed.extend(n for n in (name, lock) if n in listed)
            continue
        with dead_lock(lock, dir_fd) as fd:
            if fd is not None:
                logger.debug("removing the staging of a dead writer: %s", name)
                remove(name)
                removed.extend(n for n in (name, lock) if n in listed)
    return removed


class Staging:
    """A writer's private directory next to the target, locked from before it is made
    until after it is gone. After ``swap`` it holds the previous tree; ``close``
    removes whatever it holds, then the lock file."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.suffix, self.fd = _new_lock(site)
        self.path = site.staging_path(self.suffix)
        try:
            os.mkdir(self.path, 0o777)  # the umask applies, as for makedirs
        except BaseException:
            self._drop_lock()
            raise

    def swap(self) -> None:
        """Exchange this (complete) staging with the existing target, atomically where
        the filesystem can; afterwards ``self.path`` holds the previous tree."""
        try:
            os.pwrite(self.fd, SWAP_MARK, 0)
        except OSError as e:
            lock_path = self.site.lock_path(self.suffix)
            raise error_at(e, lock_path, "marking the staging complete") from e
        target = self.site.target
        try:
            exchange(self.path, target)
            return
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
        # No RENAME_EXCHANGE (NFS, older kernels): the target is absent between these
        # two renames; a writer that dies there is finished by ``Site.recover``.
        old = self.site.old_path(self.suffix)
        os.rename(target, old)
        try:
            os.rename(self.path, target)
        except BaseException:
            os.rename(old, target)
            raise
        os.rename(old, self.path)

    def close(self) -> None:
        """Remove the staging (or the tree it holds after a swap) and its lock; a
        failure is logged, not raised (a later writer removes what is left)."""
        try:
            rmtree(self.path)
        except OSError as e:
            logger.warning("could not remove %s (a later writer will): %s", self.path, e)
        self._drop_lock()

    def _drop_lock(self) -> None:
        unlink_lock(self.site.lock_path(self.suffix), self.fd)
        disown(self.suffix)

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _new_lock(site: Site) -> tuple[str, int]:
    """A fresh staging suffix, owned by this process, and its held lock file."""
    while True:
        suffix = f"{os.getpid()}-{uuid.uuid4().hex[:16]}"
        claim(suffix)  # before the lock file exists: no remover here opens it
        try:
            fd = os.open(
                site.lock_path(suffix), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666
            )
            if lock_still_named(fd, site.lock_path(suffix)):
                return suffix, fd
        except FileExistsError:
            pass
        except BaseException:
            disown(suffix)
            raise
        disown(suffix)  # taken for an orphan by a remover between create and lock


def _remove(path: str) -> None:
    """Remove what a dead writer left; a failure is logged, not raised: it is not this
    writer's to fail on (its lock file goes, so the next writer tries again)."""
    try:
        rmtree(path)
    except OSError as e:
        logger.warning("could not remove %s, left by a writer that died: %s", path, e)
