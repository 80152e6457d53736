"""The thread that notices when the kernel starts breaking one of this process's read
leases (``core.mapped``) and has it handed back at once.

When another process opens a leased file for writing or truncates it, the kernel
signals the holder and makes that process wait, for at most ``lease-break-time``
(``/proc/sys/fs/lease-break-time``, 45 s by default); then it revokes the lease, and
an access to a mapping of a truncated file kills the holder with SIGBUS. The
packing thread cannot be relied on to answer: it may be stalled that long (Ray's
copy of a return value waits for room in a full store), and a Python signal handler
runs only in the main thread, between bytecodes. So one daemon thread per process
waits for the break signal, and each lease's file is pointed at that thread alone
(``F_SETOWN_EX``, ``F_OWNER_TID``): the thread blocks the signal and takes it with
``sigtimedwait``, so no other thread ever sees it. The signal is ``SIGWINCH``,
ignored by default: taking a lease points its signal at the whole process until the
file is redirected (microseconds), and a break in that window is found by the poll
that every wait ends with (``KNOBS.lease_break_poll_s``), as is any other missed one.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import struct
import threading
from typing import Protocol

from air_transfer.core.knobs import KNOBS
from air_transfer.core.threads import exiting, start_daemon, stop_at_exit

logger = logging.getLogger(__name__)

#: The signal a break sends (``F_SETSIG``): ignored by default, so one that reaches
#: another thread (taking the lease, or a thread id reused after a fork) does nothing.
BREAK_SIGNAL = signal.SIGWINCH

# <asm-generic/fcntl.h>: F_SETOWN_EX with a struct f_owner_ex {int type; pid_t pid}.
_F_SETOWN_EX = 15
_F_OWNER_TID = 0


class Breakable(Protocol):
    def hand_back_if_broken(self) -> None:
        """Hand the lease back if the kernel is breaking it; never raise for that."""


class _Watcher:
    """The process's watcher thread and the leases it watches."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.leases: set[Breakable] = set()
        self.tid: int | None = None
        #: Break signals taken (the rest of the breaks were found by the poll).
        self.signals = 0

    def start(self) -> int | None:
        """The watcher's thread id, started on first use; None if it cannot run."""
        with self.lock:
            if self.tid is None:
                ready = threading.Event()
                found: list[int] = []
                try:
                    stop_at_exit(start_daemon("air-transfer-lease-breaks", self._run, ready, found))
                except RuntimeError:  # no more threads: read rather than map
                    return None
                ready.wait()
                self.tid = found[0] if found else None
            return self.tid

    def _run(self, ready: threading.Event, found: list[int]) -> None:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, {BREAK_SIGNAL})
            found.append(threading.get_native_id())
        finally:
            ready.set()
        while not exiting(0):
            if signal.sigtimedwait({BREAK_SIGNAL}, KNOBS.lease_break_poll_s) is not None:
                self.signals += 1
            with self.lock:
                leases = list(self.leases)
            for held in leases:
                try:
                    held.hand_back_if_broken()
                except Exception:  # the watcher must outlive any one lease
                    logger.exception("air-transfer: handing back a broken read lease failed")


_watcher = _Watcher()


def _forked() -> None:
    """A forked child has no watcher thread and must not touch its parent's leases."""
    global _watcher
    _watcher = _Watcher()


os.register_at_fork(after_in_child=_forked)


def ready() -> bool:
    """Start the watcher if needed: whether it runs (else leases must not be taken)."""
    return _watcher.start() is not None


def watch(held: Breakable, fd: int) -> None:
    """Watch lease ``held`` on the file open as ``fd``: its break signal goes to the
    watcher, which hands it back (``hand_back_if_broken``) until ``forget``."""
    tid = _watcher.start()
    with _watcher.lock:
        _watcher.leases.add(held)
    if tid is not None:
        try:
            fcntl.fcntl(fd, _F_SETOWN_EX, struct.pack("ii", _F_OWNER_TID, tid))
            return
        except OSError:
            pass
    # No signal at all then (no owner): the watcher's poll finds the break.
    fcntl.fcntl(fd, fcntl.F_SETOWN, 0)


def signals_taken() -> int:
    """How many break signals this process's watcher has taken (a break found only
    by its poll made a writer wait up to ``KNOBS.lease_break_poll_s``)."""
    return _watcher.signals


def forget(held: Breakable) -> None:
    """Stop watching ``held`` (released)."""
    with _watcher.lock:
        _watcher.leases.discard(held)
