"""Staging directories next to a target, owned through locks, swapped in atomically.

Every name lives in the target's parent, so it is on the target's filesystem (renames
are atomic) and on the same shared volume for every host that writes there:

- ``.<name>.air-lock``: the per-target publish lock. Publishing (and recovery) hold it.
- ``.<name>.air-staging-<id>``: a writer's staging directory, and
  ``.<name>.air-staging-<id>.lock``: the lock its writer holds from before the
  directory exists until after it is gone.
- ``.<name>.air-old-<id>``: the previous target, only for the moment of a swap on a
  filesystem without ``RENAME_EXCHANGE``.

Node storage adds ``.<name>.air-upload-<id>`` (a file being uploaded) and
``.<name>.air-trash-<id>`` (a directory being deleted). Every such name comes from
``internal_name``, which digests a ``<name>`` of over 180 bytes so that the whole
stays within ``NAME_MAX`` (255 bytes) whatever the target's name; ``is_internal``
tells them from the user's names, for listings to leave out.

**Liveness is a lock, never a pid**: a writer in another PID
namespace (a container, another host on NFS) may carry any pid. A staging directory
whose lock can be taken belongs to a dead writer and is removed. The locks are POSIX
record locks (``lockf``), which NFS (v3 with lockd, v4) carries between hosts; Linux
emulates ``flock`` with them there anyway. POSIX locks belong to a process, not a
descriptor: a process never judges or opens the lock of its own staging (``_OWN``),
and threads take the publish lock through an in-process mutex first, so a close in
one thread cannot drop another thread's lock. Lock files are removed on release with
the usual safe pattern: unlink while holding it; whoever acquires a lock checks that
its descriptor is still the file at that path, else retries.

**A target is absent or complete.** A fresh target is one ``rename``. A merge swaps a
complete merged tree in with ``renameat2(RENAME_EXCHANGE)``; where the filesystem
refuses that, with two renames (target -> ``air-old``, staging -> target) that a later
writer finishes or rolls back (``recover``).

Plain Python (Linux for the exchange; elsewhere the two-rename swap): unit-tested
without Ray.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import logging
import os
import platform
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator

from air_transfer.core.dirtree import rmtree
from air_transfer.errors import error_at

logger = logging.getLogger(__name__)

_STAGING = ".air-staging-"
_OLD = ".air-old-"
_PUBLISH_LOCK = ".air-lock"
_LOCK_SUFFIX = ".lock"
#: Marks the staging file of an upload through node storage (``storage.disk_uploads``).
UPLOAD_MARK = ".air-upload-"
#: Marks a directory being deleted by node storage (``storage.disk``).
TRASH_MARK = ".air-trash-"
_MARKS = (_STAGING, _OLD, _PUBLISH_LOCK, UPLOAD_MARK, TRASH_MARK)
#: A target name longer than this (bytes) is digested in the names made from it: the
#: dot, the longest mark and suffix add at most 46 bytes, and a name may have 255.
_LONG_NAME = 180
_SUFFIX = re.compile(r"\d+-[0-9a-f]+")
#: A writer's staging directory or its lock file: (stem, suffix).
_STAGED = re.compile(r"(\..*)\.air-staging-(\d+-[0-9a-f]+)(?:\.lock)?", re.DOTALL)
#: The previous target a swap set aside: (stem, suffix).
_SET_ASIDE = re.compile(r"(\..*)\.air-old-(\d+-[0-9a-f]+)", re.DOTALL)
#: Written into a staging lock file just before the swap: the staging is complete.
SWAP_MARK = b"swap\n"

#: Staging suffixes of this process's live writers: never judged, never opened by a
#: remover in this process (closing any descriptor of a POSIX-locked file would drop
#: the owner's lock).
_OWN: set[str] = set()
_OWN_GUARD = threading.Lock()


def internal_name(name: str, mark: str, suffix: str = "") -> str:
    """The hidden name ``.<name><mark><suffix>`` of something the library makes next
    to ``name`` (``name`` digested if long: see the module)."""
    return f"{_stem(name)}{mark}{suffix}"


def is_internal(name: str) -> bool:
    """Whether ``name`` is one that ``internal_name`` makes (listings leave it out)."""
    return name.startswith(".") and any(mark in name for mark in _MARKS)


class Site:
    """The hidden names next to one target (``parent/name``)."""

    def __init__(self, parent: str, name: str) -> None:
        self.parent, self.name = parent, name
        self.target = os.path.join(parent, name)
        self._stem = _stem(name)

    def staging_path(self, suffix: str) -> str:
        return os.path.join(self.parent, internal_name(self.name, _STAGING, suffix))

    def lock_path(self, suffix: str) -> str:
        return self.staging_path(suffix) + _LOCK_SUFFIX

    def old_path(self, suffix: str) -> str:
        return os.path.join(self.parent, internal_name(self.name, _OLD, suffix))

    @contextlib.contextmanager
    def publish_lock(self) -> Iterator[None]:
        """Serialise publishing into this target: threads, processes, and hosts that
        share the volume."""
        path = os.path.join(self.parent, internal_name(self.name, _PUBLISH_LOCK))
        with _process_mutex(path):
            fd = _acquire(path)
            try:
                yield
            finally:
                _unlink_lock(path, fd)

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
        for suffix in self._scan()[1] - _own():
            with _dead_lock(self.lock_path(suffix)) as fd:
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
                for mark, suffixes in zip((_STAGING, _OLD), found, strict=True):
                    prefix = f"{self._stem}{mark}"
                    if entry.startswith(prefix):
                        rest = entry[len(prefix) :].removesuffix(_LOCK_SUFFIX)
                        if _SUFFIX.fullmatch(rest):
                            suffixes.add(rest)
        return found


def reclaim_dead(
    dir_fd: int, where: str, names: Iterable[str], remove: Callable[[str], None]
) -> list[str]:
    """Remove what dead writers left, whatever their target, from the open directory
    ``dir_fd`` (at path ``where``) whose entries ``names`` were listed before this
    call: each staging whose lock can be taken (the lock of a dead writer is free:
    any pid, any host), then its lock file; and each free publish lock. Never a live
    writer's (its lock is held, or it is of this process: ``_OWN``, ``_MUTEXES``),
    nor a staging a swap left half done (an ``air-old`` of the same id: only the
    target's next writer can settle it, ``Site.recover_locked``). ``remove(name)``
    removes one staging directory. Returns the staging names removed."""
    staged: set[tuple[str, str]] = set()
    aside: set[tuple[str, str]] = set()
    publish: list[str] = []
    for name in names:
        if found := _STAGED.fullmatch(name):
            staged.add((found[1], found[2]))
        elif found := _SET_ASIDE.fullmatch(name):
            aside.add((found[1], found[2]))
        elif name.startswith(".") and name.endswith(_PUBLISH_LOCK):
            publish.append(name)
    for name in publish:
        with _unused_here(os.path.join(where, name)) as unused:
            if unused:
                with _dead_lock(name, dir_fd):
                    pass  # taken (its holder is dead): unlinked on the way out
    own = _own()  # after the listing: a writer of this process listed there is in it
    removed = []
    for stem, suffix in sorted(staged - aside):
        if suffix in own:
            continue
        name = f"{stem}{_STAGING}{suffix}"
        with _dead_lock(name + _LOCK_SUFFIX, dir_fd) as fd:
            if fd is not None:
                logger.debug("removing the staging of a dead writer: %s", name)
                remove(name)
                removed.append(name)
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
        _unlink_lock(self.site.lock_path(self.suffix), self.fd)
        _disown(self.suffix)

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _new_lock(site: Site) -> tuple[str, int]:
    """A fresh staging suffix, owned by this process, and its held lock file."""
    while True:
        suffix = f"{os.getpid()}-{uuid.uuid4().hex[:16]}"
        with _OWN_GUARD:
            _OWN.add(suffix)  # before the lock file exists: no remover here opens it
        try:
            fd = os.open(
                site.lock_path(suffix), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666
            )
            if _lock_still_named(fd, site.lock_path(suffix)):
                return suffix, fd
        except FileExistsError:
            pass
        except BaseException:
            _disown(suffix)
            raise
        _disown(suffix)  # taken for an orphan by a remover between create and lock


# -- renameat2 -------------------------------------------------------------------------
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
#: ``SYS_renameat2`` where libc predates its wrapper (glibc < 2.28).
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "riscv64": 276, "ppc64le": 357, "s390x": 347}


def exchange(a: str, b: str) -> None:
    """Swap the paths ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``,
    Linux >= 3.15 on ext4, xfs, btrfs, tmpfs...). OSError EINVAL/ENOSYS/ENOTSUP where
    the system or filesystem cannot."""
    libc = _libc()
    func = getattr(libc, "renameat2", None) if libc is not None else None
    number = _SYS_RENAMEAT2.get(platform.machine())
    old, new = ctypes.c_char_p(os.fsencode(a)), ctypes.c_char_p(os.fsencode(b))
    at, flags = ctypes.c_int(_AT_FDCWD), ctypes.c_uint(_RENAME_EXCHANGE)
    if func is not None:
        result = func(at, old, at, new, flags)
    elif libc is not None and number is not None:
        result = libc.syscall(ctypes.c_long(number), at, old, at, new, flags)
    else:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), a, None, b)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), a, None, b)


_LIBC: list[ctypes.CDLL | None] = []


def _libc() -> ctypes.CDLL | None:
    if not _LIBC:
        try:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]


# -- lock files ------------------------------------------------------------------------
class _Mutex:
    """A thread lock per lock file, with the count of threads using it (so that the
    table does not grow by one entry per target ever written)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


_MUTEXES: dict[tuple[int, int, str], _Mutex] = {}
_MUTEXES_GUARD = threading.Lock()


def _mutex_key(path: str) -> tuple[int, int, str]:
    """The publish lock ``path`` by its directory itself (device, inode) and name, not
    by its path: the writers of one target may name it differently (a symlink on the
    way, a ``/proc/self/fd`` path)."""
    parent, name = os.path.split(path)
    st = os.stat(parent)
    return (st.st_dev, st.st_ino, name)


@contextlib.contextmanager
def _process_mutex(path: str) -> Iterator[None]:
    key = _mutex_key(path)
    with _MUTEXES_GUARD:
        mutex = _MUTEXES.setdefault(key, _Mutex())
        mutex.users += 1
    try:
        with mutex.lock:
            yield
    finally:
        with _MUTEXES_GUARD:
            mutex.users -= 1
            if not mutex.users:
                del _MUTEXES[key]


@contextlib.contextmanager
def _unused_here(path: str) -> Iterator[bool]:
    """Whether no thread of this process uses the publish lock ``path``; while True,
    none can start to (they wait on its process mutex, held here): a remover may
    judge the lock without dropping the lock of a publisher of this process (a
    directory that cannot be looked at is taken as in use: nothing is removed)."""
    try:
        key = _mutex_key(path)
    except OSError:
        yield False
        return
    with _MUTEXES_GUARD:
        if key in _MUTEXES:
            mutex = None
        else:
            mutex = _MUTEXES[key] = _Mutex()
            mutex.users = 1
            mutex.lock.acquire()
    if mutex is None:
        yield False
        return
    try:
        yield True
    finally:
        with _MUTEXES_GUARD:
            mutex.users -= 1
            if not mutex.users:
                del _MUTEXES[key]
        mutex.lock.release()


def _acquire(path: str) -> int:
    """Open (creating) and lock ``path``; retry until the locked file is the one at
    ``path`` (a releaser unlinks it while holding the lock)."""
    while True:
        # Never through a symlink: one planted there would have the lock made outside.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        if _lock_still_named(fd, path):
            return fd


def _lock_still_named(fd: int, path: str) -> bool:
    """Lock ``fd`` (waiting); True if it is still the file named ``path``, else
    close it and return False."""
    try:
        _lockf(fd, fcntl.LOCK_EX, path)
        if _names(path, fd):
            return True
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return False


def _lockf(fd: int, how: int, path: str) -> None:
    try:
        fcntl.lockf(fd, how)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            raise  # held by another process: the caller's answer, not an error
        hint = "locking it; on NFS, mount with working locks (not nolock)"
        raise error_at(e, path, hint) from e


def _names(path: str, fd: int, dir_fd: int | None = None) -> bool:
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _unlink_lock(path: str, fd: int, dir_fd: int | None = None) -> None:
    """Unlink a lock file while holding it, then let go of it."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path, dir_fd=dir_fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _dead_lock(path: str, dir_fd: int | None = None) -> Iterator[int | None]:
    """Take the staging lock file ``path`` (in the directory ``dir_fd``, if given) if
    its writer is gone: yields None while the writer lives (the lock is taken), else
    the held descriptor, or -1 if the lock file is gone too. On a clean exit the lock
    file is removed. (Never opened for a staging of this process: see ``_OWN``.)"""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        yield -1
        return
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        yield None  # a symlink, not a writer's lock file: left alone
        return
    try:
        _lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, path)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise
        yield None
        return
    if not _names(path, fd, dir_fd):  # its owner (or a remover) unlinked it: gone too
        os.close(fd)
        yield -1
        return
    try:
        yield fd
    except BaseException:
        os.close(fd)
        raise
    _unlink_lock(path, fd, dir_fd)


def _remove(path: str) -> None:
    """Remove what a dead writer left; a failure is logged, not raised: it is not this
    writer's to fail on (its lock file goes, so the next writer tries again)."""
    try:
        rmtree(path)
    except OSError as e:
        logger.warning("could not remove %s, left by a writer that died: %s", path, e)


def _own() -> set[str]:
    with _OWN_GUARD:
        return set(_OWN)


def _disown(suffix: str) -> None:
    with _OWN_GUARD:
        _OWN.discard(suffix)


def _stem(name: str) -> str:
    return f".{name if len(os.fsencode(name)) <= _LONG_NAME else _digest(name)}"


def _digest(name: str) -> str:
    return hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
