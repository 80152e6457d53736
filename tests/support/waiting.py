"""One way to wait in a test: poll a condition until a deadline, never a fixed sleep."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    cond: Callable[[], T],
    what: str | Callable[[], str],
    timeout_s: float = 30,
    interval_s: float = 0.1,
) -> T:
    """Call ``cond`` until it returns something truthy, and return that; after
    ``timeout_s`` fail with an AssertionError naming ``what`` (a callable is called
    then, to say what was last seen).

    Between calls, garbage is collected (a ref held in a reference cycle is released
    only then, and Ray frees its object only after that) and the thread sleeps
    ``interval_s``; with ``interval_s=0`` it only yields the CPU, for a watcher that
    must act the moment the condition holds.
    """
    deadline = time.monotonic() + timeout_s
    while not (result := cond()):
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s} s waiting for {said}")
        if interval_s > 0:
            gc.collect()
            time.sleep(interval_s)
        else:
            os.sched_yield()
    return result
