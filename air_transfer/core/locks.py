"""Lock files: liveness of a writer is a POSIX record lock it holds, never a pid.

A writer in another PID namespace (a container, another host on NFS) may carry any
pid; a lock that can be taken belongs to a dead writer. POSIX locks belong to a
process, not a descriptor: a process never judges or opens the lock of its own
staging (``own``), and threads take a publish lock through an in-process mutex
first, so a close in one thread cannot drop another thread's lock. Lock files are
removed on release with the usual safe pattern: unlink while holding it; whoever
acquires a lock checks that its descriptor is still the file at that path.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Iterator

from air_transfer.errors import error_at

#: Staging suffixes of this process's live writers: never judged, never opened by a
#: remover in this process (closing any descriptor of a POSIX-locked file would drop
#: the owner's lock).
_OWN: set[str] = set()
_OWN_GUARD = threading.Lock()


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
def process_mutex(path: str) -> Iterator[None]:
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
def unused_here(path: str) -> Iterator[bool]:
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


def acquire(path: str) -> int:
    """Open (creating) and lock ``path``; retry until the locked file is the one at
    ``path`` (a releaser unlinks it while holding the lock)."""
    while True:
        # Never through a symlink: one planted there would have the lock made outside.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        if lock_still_named(fd, path):
            return fd


def lock_still_named(fd: int, path: str) -> bool:
    """Lock ``fd`` (waiting); True if it is still the file named ``path``, else
    close it and return False."""
    try:
        lockf(fd, fcntl.LOCK_EX, path)
        if names_file(path, fd):
            return True
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return False


def lockf(fd: int, how: int, path: str) -> None:
    try:
        fcntl.lockf(fd, how)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            raise  # held by another process: the caller's answer, not an error
        hint = "locking it; on NFS, mount with working locks (not nolock)"
        raise error_at(e, path, hint) from e


def names_file(path: str, fd: int, dir_fd: int | None = None) -> bool:
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def unlink_lock(path: str, fd: int, dir_fd: int | None = None) -> None:
    """Unlink a lock file while holding it, then let go of it."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path, dir_fd=dir_fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def dead_lock(path: str, dir_fd: int | None = None) -> Iterator[int | None]:
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
        lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, path)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise
        yield None
        return
    if not names_file(path, fd, dir_fd):  # its owner (or a remover) unlinked it: gone too
        os.close(fd)
        yield -1
        return
    try:
        yield fd
    except BaseException:
        os.close(fd)
        raise
    unlink_lock(path, fd, dir_fd)


def is_dead(path: str, dir_fd: int | None = None) -> bool:
    """Whether the writer of the lock file ``path`` is gone (its lock can be taken, or
    the file is gone too), as ``dead_lock`` judges it, without removing anything: the
    lock taken to tell is let go at once. A symlink is never a dead writer's lock.
    (Never asked of a staging of this process: see ``_OWN``.)"""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return True
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        return False
    try:
        lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, path)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise
        return False
    finally:
        os.close(fd)
    return True


def own() -> set[str]:
    """Staging suffixes of this process's live writers."""
    with _OWN_GUARD:
        return set(_OWN)


def claim(suffix: str) -> None:
    """``suffix`` is a live writer of this process from now on (before its lock
    file exists: no remover here opens it)."""
    with _OWN_GUARD:
        _OWN.add(suffix)


def disown(suffix: str) -> None:
    """The writer ``suffix`` of this process is done."""
    with _OWN_GUARD:
        _OWN.discard(suffix)
