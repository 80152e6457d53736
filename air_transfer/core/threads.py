"""Every background thread of the library, started here: a daemon, named for what it
does (``air-transfer-...``), so that a stack dump or ``threading.enumerate()`` says
whose each thread is, and none keeps a process alive at exit.

``start_daemon`` runs a function once; ``pool`` makes a named thread pool;
``Periodic`` runs a function every few seconds, from its first ``start()`` while its
owner lives (the reapers of idle or dead entries, the watchers that notice what
nobody asks about), and no longer than the process's exit handlers: a thread that
wakes while the interpreter and the native libraries (Ray's core worker, torch) are
being torn down can crash the process. A loop of its own that wakes on a timeout
waits on ``exiting`` and is joined at exit (``stop_at_exit``) for the same reason.
Plain Python.
"""

from __future__ import annotations

import atexit
import threading
import time
import types
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec

P = ParamSpec("P")

#: Every thread's name starts with this.
PREFIX = "air-transfer"


def start_daemon(
    name: str, target: Callable[P, object], *args: P.args, **kwargs: P.kwargs
) -> threading.Thread:
    """Start ``target(*args, **kwargs)`` on a new daemon thread named ``name``
    (which must start with ``air-transfer``); the thread, started."""
    _check(name)
    thread = threading.Thread(target=target, args=args, kwargs=kwargs, name=name, daemon=True)
    thread.start()
    return thread


def pool(
    name: str, workers: int, initializer: Callable[[], object] | None = None
) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads named ``name_N`` (``name`` starts with
    ``air-transfer``), each running ``initializer`` first. Its threads are not
    daemons: ``concurrent.futures`` lets the work in flight finish at exit."""
    _check(name)
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=initializer)


def _check(name: str) -> None:
    if not name.startswith(PREFIX):
        raise ValueError(f"a thread of the library is named {PREFIX}...: got {name!r}")


def exiting(timeout: float) -> bool:
    """Wait ``timeout`` seconds, or less if the process is exiting; whether it is.
    The wait of a loop that wakes on a timeout (``stop_at_exit`` its thread)."""
    return _at_exit.stopping.wait(timeout)


def stop_at_exit(thread: threading.Thread) -> threading.Thread:
    """Join ``thread``, whose loop waits on ``exiting``, at the process's exit."""
    _at_exit.add(thread)
    return thread


class Periodic:
    """Calls ``tick()`` every ``period()`` seconds (read before each wait, so that a
    changed knob applies) on one daemon thread named ``name``, started by the first
    ``start()``. The one periodic loop of the package.

    ``idle()``, if given, is asked after each tick: True ends the thread, and the
    next ``start()`` starts another (a watcher that runs only while it has something
    to watch: its owner adds work, then calls ``start()``; asked under the lock
    ``start()`` takes, so no work is added unseen as the thread ends). ``stop()``
    ends the thread before its next tick. A bound method ``tick`` is held weakly:
    the thread ends once its object is gone (a cache's reaper does not keep the
    cache, and its chunk refs, alive). Every such thread ends at the process's exit,
    before the interpreter is torn down. An exception from ``tick`` ends the thread,
    as in a plain loop: a tick that must survive its errors catches them itself."""

    def __init__(
        self,
        name: str,
        period: Callable[[], float],
        tick: Callable[[], object],
        idle: Callable[[], bool] | None = None,
    ) -> None:
        self.name = name
        self._period = period
        self._tick: Callable[[], Callable[[], object] | None]
        if isinstance(tick, types.MethodType):
            self._tick = weakref.WeakMethod(tick)
        else:
            self._tick = lambda: tick
        self._idle = idle
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread unless it runs already (or ``stop`` was called)."""
        with self._lock:
            if self._thread is None and not self._stopped.is_set():
                self._thread = stop_at_exit(start_daemon(self.name, self._run))

    def stop(self) -> None:
        """No tick after the one running now, if any."""
        self._stopped.set()

    def _run(self) -> None:
        while not exiting(self._period()) and not self._stopped.is_set():
            tick = self._tick()
            if tick is None:
                return
            tick()
            del tick  # not held across the wait
            if self._idle is not None:
                with self._lock:
                    if self._idle():
                        self._thread = None
                        return


class _ExitStop:
    """The threads of ``Periodic`` and ``stop_at_exit``, told to stop and joined by
    an exit handler registered with the first: exit handlers run last-registered
    first, so this one runs before those of Ray (``ray.shutdown``) and pyarrow,
    registered when they were imported."""

    #: How long the exit handler waits for the ticks in progress, all together.
    JOIN_S = 2.0

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._registered = False

    def add(self, thread: threading.Thread) -> None:
        with self._lock:
            self._threads.add(thread)
            if not self._registered:
                atexit.register(self.stop)
                self._registered = True

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            threads = [t for t in self._threads if t is not threading.current_thread()]
        deadline = time.monotonic() + self.JOIN_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


_at_exit = _ExitStop()
