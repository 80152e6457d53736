"""One daemon thread for the work finalizers hand off.

A finalizer (``__del__`` of a write stream dropped unclosed) may run inside a garbage
collection that interrupted any code, a progress bar's or Ray's own while they hold
their locks: work that takes locks must not run there. ``later`` queues work for this
thread; ``soon`` runs it at once when no collection is running (so a failed pyarrow
call returns with its staging already removed) and queues it otherwise. Call
``start`` outside any finalizer (in the constructor of what may be dropped): a
thread is not started from inside a collection.
"""

from __future__ import annotations

import functools
import gc
import logging
import queue
from collections.abc import Callable

from air_transfer.core.threads import start_daemon

logger = logging.getLogger(__name__)

Work = Callable[[], None]


class _Deferred:
    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Work] = queue.SimpleQueue()
        self.collecting = False
        gc.callbacks.append(self._phase)
        start_daemon("air-transfer-deferred", self._run)

    def _phase(self, phase: str, info: dict[str, int]) -> None:
        self.collecting = phase == "start"

    def _run(self) -> None:
        while True:
            work = self.queue.get()
            try:
                work()
            except Exception as e:  # deferred work has no caller left to raise to
                logger.warning("air-transfer: deferred clean-up failed: %r", e)


@functools.cache
def start() -> _Deferred:
    """Start the thread (once per process)."""
    return _Deferred()


def later(work: Work) -> None:
    """Run ``work`` on the deferred-work thread."""
    start().queue.put(work)


def soon(work: Work) -> None:
    """Run ``work`` now, unless a garbage collection is running: then ``later``."""
    deferred = start()
    if deferred.collecting:
        deferred.queue.put(work)
    else:
        work()
