"""Fetch object-store chunks in order with a bounded window in flight.

Shared by every strategy and by node-storage reads; Ray's public API only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import ray

from air_transfer.core.knobs import KNOBS


def fetch_in_order(refs: Iterable[Any], window: int) -> Iterator[Any]:
    """Yield ``ray.get(ref)`` for each ref in order (a list, or a streaming
    generator's refs as they come), keeping up to ``window`` gets in flight ahead so
    cross-node pulls overlap with the consumer's work.

    Threads, not ``ray.wait(fetch_local=True)``: a get in flight is a pull that Ray
    keeps going, and its result is dropped as soon as the consumer moves on.
    """
    pending: deque[Future[Any]] = deque()
    threads = min(window, KNOBS.max_fetch_threads)
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="air-transfer-fetch")
    try:
        upcoming = iter(refs)
        for ref in upcoming:
            pending.append(pool.submit(ray.get, ref))
            if len(pending) >= window:
                break
        while pending:
            result = pending.popleft().result()
            nxt = next(upcoming, None)
            if nxt is not None:
                pending.append(pool.submit(ray.get, nxt))
            yield result
            del result
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
