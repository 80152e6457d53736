"""Every background thread of the library, started here: a daemon, named for what it
does (``air-transfer-...``), so that a stack dump or ``threading.enumerate()`` says
whose each thread is, and none keeps a process alive at exit.

``start_daemon`` runs a function once; ``Periodic`` runs one every few seconds, from
its first ``start()`` until the process ends (the reapers of idle or dead entries,
the watchers that notice what nobody asks about). Plain Python.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import ParamSpec

P = ParamSpec("P")

#: Every thread's name starts with this.
PREFIX = "air-transfer"


def start_daemon(
    name: str, target: Callable[P, object], *args: P.args, **kwargs: P.kwargs
) -> threading.Thread:
    """Start ``target(*args, **kwargs)`` on a new daemon thread named ``name``
    (which must start with ``air-transfer``); the thread, started."""
    if not name.startswith(PREFIX):
        raise ValueError(f"a thread of the library is named {PREFIX}...: got {name!r}")
    thread = threading.Thread(target=target, args=args, kwargs=kwargs, name=name, daemon=True)
    thread.start()
    return thread


class Periodic:
    """Calls ``tick()`` every ``period()`` seconds (read before each wait, so that a
    changed knob applies) on one daemon thread named ``name``, started by the first
    ``start()``. An exception from ``tick`` ends the thread, as in a plain loop:
    a tick that must survive its errors catches them itself."""

    def __init__(self, name: str, period: Callable[[], float], tick: Callable[[], object]) -> None:
        self.name = name
        self._period = period
        self._tick = tick
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread unless it was started already."""
        with self._lock:
            if self._thread is None:
                self._thread = start_daemon(self.name, self._run)

    def _run(self) -> None:
        while True:
            time.sleep(self._period())
            self._tick()
