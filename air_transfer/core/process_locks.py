"""Whether a process of this machine still runs, told by another process: each
process that asks to be watched holds a POSIX record lock on a lock file of its own
for its whole life (``hold``); the kernel drops it when the process dies, however it
dies and whatever pid it has in its namespace. A lock that can be taken, or a lock
file gone, is a dead process's (``dead``). Liveness is a lock, never a pid
(``core.locks``).

The lock files live in one directory per user (``LOCKS``), named ``<uuid>.lock``.
A ``ProcessLock`` carries that directory's identity (device, inode) as its holder
saw it: a process that sees another directory there (another container's ``/tmp``)
cannot tell, and takes the holder for alive. A process removes its own lock file at
a normal exit; a process starting to hold one removes those of dead processes.

Plain Python (Linux/POSIX ``lockf``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
import tempfile
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

#: The directory of every lock file of this user on this machine.
LOCKS = os.path.join(tempfile.gettempdir(), f"air-transfer-{os.getuid()}", "processes")
_SUFFIX = ".lock"


@dataclass(frozen=True)
class ProcessLock:
    """The lock file ``name`` that a process holds in ``LOCKS``, whose identity (device,
    inode) is ``directory`` as that process saw it."""

    directory: tuple[int, int]
    name: str


@dataclass(frozen=True)
class Process:
    """A process of the cluster's node ``node_id`` that holds ``lock`` there while it
    runs (``cluster.liveness`` asks that node)."""

    node_id: str
    lock: ProcessLock


_lock = threading.Lock()
_held: tuple[int, int, ProcessLock] | None = None  # (pid, fd, lock) of this process


def hold() -> ProcessLock:
    """This process's lock, taken on first use and held until it exits (a forked
    child takes its own: POSIX locks are not inherited)."""
    global _held
    with _lock:
        if _held is not None and _held[0] == os.getpid():
            return _held[2]
        os.makedirs(LOCKS, mode=0o700, exist_ok=True)
        dir_fd = os.open(LOCKS, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            st = os.fstat(dir_fd)
            stem = uuid.uuid4().hex
            name = f"{stem}{_SUFFIX}"
            # Locked under another name first: a lock file is never seen unlocked
            # while its process lives.
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            fd = os.open(f"{stem}.new", flags, 0o600, dir_fd=dir_fd)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(f"{stem}.new", name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            lock = ProcessLock((st.st_dev, st.st_ino), name)
            _held = (os.getpid(), fd, lock)
            names = [n for n in os.listdir(dir_fd) if n.endswith(_SUFFIX) and n != name]
            for other in names:  # what dead processes left (bounded: one per process)
                _take_if_dead(dir_fd, other)
        finally:
            os.close(dir_fd)
        atexit.register(_release, os.getpid(), fd, name)
        return lock


def dead(locks: Iterable[ProcessLock]) -> list[ProcessLock]:
    """Those of ``locks`` whose process is dead (each such lock file is removed);
    one this process cannot judge (another ``LOCKS`` directory, its own) is left out."""
    try:
        dir_fd = os.open(LOCKS, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []  # no process of this machine ever held one here
    try:
        st = os.fstat(dir_fd)
        here = (st.st_dev, st.st_ino)
        own = _held[2].name if _held is not None and _held[0] == os.getpid() else None
        return [
            lock
            for lock in locks
            if lock.directory == here and lock.name != own and _take_if_dead(dir_fd, lock.name)
        ]
    finally:
        os.close(dir_fd)


def _take_if_dead(dir_fd: int, name: str) -> bool:
    """Whether lock file ``name`` is a dead process's: gone, or its lock free (then
    taken, and the file removed while held, so nobody takes it for alive again)."""
    if os.path.basename(name) != name or not name.endswith(_SUFFIX):
        return False  # not one of ours: never opened
    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                return False  # held: its process runs
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return True
    finally:
        os.close(fd)  # drops the lock taken here


def _release(pid: int, fd: int, name: str) -> None:
    """At a normal exit: remove this process's lock file, then let go of it."""
    if os.getpid() != pid:
        return
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(LOCKS, name))
    with contextlib.suppress(OSError):
        os.close(fd)
