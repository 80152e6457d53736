"""A fence over calls counted by key: fencing a key refuses every later call of it
and waits for the calls of it running now, so that once it returns, what they did
is all they will do. Node storage fences the calls of a replicated change whose
caller died (``storage.server.op_fence``) and the reports of a Ray Train worker
group being stopped (``storage.server.report_ledger``). Plain Python.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator


class Fence:
    """The calls running now, by key, and the keys fenced off (each for ``keep_s``
    seconds: a fenced key's callers are long gone after it)."""

    def __init__(self, keep_s: float = math.inf) -> None:
        self._cond = threading.Condition()
        self._running: Counter[str] = Counter()
        self._fenced: dict[str, float] = {}  # key -> when fenced (monotonic)
        self._keep_s = keep_s

    def is_fenced(self, key: str) -> bool:
        with self._cond:
            return key in self._fenced

    @contextlib.contextmanager
    def running(self, key: str, refused: Callable[[], BaseException]) -> Iterator[None]:
        """Run one call of ``key``; raises ``refused()`` if ``key`` is fenced off."""
        with self._cond:
            if key in self._fenced:
                raise refused()
            self._running[key] += 1
        try:
            yield
        finally:
            with self._cond:
                self._running[key] -= 1
                if not self._running[key]:
                    del self._running[key]
                self._cond.notify_all()

    def fence(self, keys: Collection[str], timeout_s: float = math.inf) -> list[str]:
        """Refuse every later call of ``keys``; wait up to ``timeout_s`` for their
        calls running now. Returns the keys still running (none: fenced whole)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            now = time.monotonic()
            for old in [k for k, t in self._fenced.items() if now - t > self._keep_s]:
                del self._fenced[old]
            self._fenced.update(dict.fromkeys(keys, now))
            while True:
                left = [k for k in keys if self._running[k]]
                wait = deadline - time.monotonic()
                if not left or wait <= 0:
                    return left
                self._cond.wait(None if wait == math.inf else wait)
