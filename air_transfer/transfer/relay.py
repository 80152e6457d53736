"""Relays, run by a node agent: a ref whose value is handed over after it exists.

``to_object_ref_async`` returns the checkpoint's ref before its packing tasks are
submitted (that runs on a background thread of the caller: docs/performance.md). The
ref is the return of an agent call, ``Relays.take(key)``, which waits here until the
caller's thread hands over the checkpoint (``Relays.give(key, value)``) and returns
it; each runs in its own concurrency group of the agent (waits cannot hold up the
hand-overs that end them).
Ray creates a task's return ref at submission, owned by the submitter, so the ref is
the caller's as a ``ray.put`` would be, and a reader given it waits as for a chunk
not yet packed. A value that is an exception (the submission failed) is raised to
every reader instead; a caller that dies before handing over frees the wait.
"""

from __future__ import annotations

import os
import threading

from air_transfer.cluster.fetch import fresh
from air_transfer.cluster.nodes import HANDOVER_GROUP, RELAY_GROUP
from air_transfer.cluster.rpc import in_group, served
from air_transfer.core.knobs import KNOBS
from air_transfer.errors import CheckpointLostError


class Relays:
    """The values handed over and the waits for them, by key (each key used once):
    what a node agent answers for relays (callers name these methods), each in its
    own concurrency group, so that waits cannot hold up the hand-overs that end them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[str, tuple[threading.Event, list[object]]] = {}

    @served
    @in_group(HANDOVER_GROUP)
    def give(self, key: str, value: object) -> None:
        """Hand over the value of ``key`` (before or after its ``take`` started)."""
        ready, box = self._slot(key)
        box.append(value)
        ready.set()

    @served
    @in_group(RELAY_GROUP)
    def take(self, key: str, pid: int, poll_s: float | None = None) -> object:
        """The value of ``key`` once given (raised if it is an exception), checking
        every ``poll_s`` (default ``KNOBS.relay_poll_s``) that the giver, process
        ``pid`` of this node, still runs."""
        ready, box = self._slot(key)
        try:
            while not ready.wait(KNOBS.relay_poll_s if poll_s is None else poll_s):
                if not _alive(pid):
                    raise CheckpointLostError(
                        f"process {pid} exited before it handed over the checkpoint it "
                        "was transferring (to_object_ref_async)"
                    )
        finally:
            with self._lock:
                self._slots.pop(key, None)
        value = box[0]
        if isinstance(value, BaseException):
            raise fresh(value)
        return value

    @served
    def waiting(self) -> int:
        """How many keys have a value or a wait pending (0 when idle)."""
        with self._lock:
            return len(self._slots)

    def _slot(self, key: str) -> tuple[threading.Event, list[object]]:
        with self._lock:
            return self._slots.setdefault(key, (threading.Event(), []))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it runs
        return True
    return True
