"""What the bench samples while a round trip runs: the private memory of the producer
and consumer processes and the object store's use, with a watchdog on the memory
still available."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import psutil
import ray

from benchmarks.units import MiB

SAMPLE_INTERVAL_S = 0.02


def private_bytes(pid: int) -> int | None:
    """``RssAnon`` of ``pid`` in bytes (None once it has exited): the anonymous
    memory it has touched, without the object-store pages it maps."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def object_store_used() -> int:
    """Bytes used in the object store, summed over nodes, as raylets last reported."""
    total = ray.cluster_resources().get("object_store_memory", 0)
    return int(total - ray.available_resources().get("object_store_memory", 0))


def wait_for_store_at_most(limit_bytes: int, timeout_s: float) -> bool:
    """Wait until the object store's use falls to ``limit_bytes`` or ``timeout_s``
    passes, and say whether it did: objects are freed asynchronously, some time
    after their last reference (their owner frees them, and the raylets report the
    store's use a moment later)."""
    deadline = time.monotonic() + timeout_s
    while (over := object_store_used() > limit_bytes) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not over


class Sampler:
    """Samples the peak private memory of the watched processes and the object
    store's use every ``SAMPLE_INTERVAL_S`` in a background thread.

    If available memory falls under ``floor_bytes`` it calls ``on_low`` once (which
    kills the run's actors) and sets ``aborted``, instead of waiting for the kernel's
    OOM killer to pick a victim, maybe the Ray head.
    """

    def __init__(
        self, pids: dict[str, int | None], floor_bytes: int, on_low: Callable[[], object]
    ) -> None:
        self._pids = {role: pid for role, pid in pids.items() if pid}
        self._floor, self._on_low = floor_bytes, on_low
        self.peaks: dict[str, int] = {}
        self._store_base = object_store_used()
        self.store_peak = 0
        self.aborted = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def watch(self, role: str, pid: int | None) -> None:
        """Also sample ``pid`` as ``role`` (a process started during the run)."""
        if pid:
            self._pids[role] = pid
            self._sample()

    def __enter__(self) -> Sampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self._sample()
            tick += 1
            if tick % 5 == 0 and not self.aborted:
                self._check_available()

    def _sample(self) -> None:
        for role, pid in list(self._pids.items()):
            used = private_bytes(pid)
            if used is not None:
                self.peaks[role] = max(self.peaks.get(role, 0), used)
        with contextlib.suppress(Exception):  # a GCS hiccup must not end the sampling
            self.store_peak = max(self.store_peak, object_store_used() - self._store_base)

    def _check_available(self) -> None:
        if psutil.virtual_memory().available < self._floor:
            self.aborted = True
            self._on_low()

    def settle(self, timeout_s: float = 3.0) -> None:
        """Wait (briefly) until the run's objects are freed, so the next run starts
        from the same object-store baseline."""
        wait_for_store_at_most(self._store_base + MiB, timeout_s)
