"""Node storage, the storage-node side: the checkpoint directories Ray Train's
reports store on this node, noted by worker until Train stops that worker's group.

Ray Train registers a reported checkpoint only once every worker's report of that
round has reached its controller. When a worker fails first, the controller stops
the whole group, and a checkpoint another worker was still storing stays in storage,
tracked by nobody (ray-project/ray#41700); here the storage node's agent would even
finish it after its worker is gone. So the agent stores each hooked report through
``ReportLedger.store``, which notes the path under the worker, and the controller,
about to stop a group, calls ``reclaim``: it fences the group's workers (a store of
theirs still running stops at its next chunk, a later one is refused), waits for
their stores to end, and deletes what they stored that Train does not track. A
report its workers write themselves (torch DCP) is noted as its directory is made
(``note``), and deleted the same way.

Runs in the storage node's agent, which keeps the notes for its lifetime. Plain
Python: unit-tested without Ray.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import TypeVar

from air_transfer.core.fence import Fence

T = TypeVar("T")


class GroupStoppedError(RuntimeError):
    """A report of a worker whose group Ray Train has stopped: not stored."""


class ReportLedger:
    """Which checkpoint paths each worker's reports stored, and which workers'
    groups have been stopped (fenced: ``core.fence``)."""

    def __init__(self) -> None:
        self._workers = Fence()  # a worker's stores running, and workers stopped
        self._lock = threading.Lock()
        self._stored: dict[str, set[str]] = {}  # worker -> paths stored or being stored

    def store(self, worker: str, path: str, write: Callable[[Callable[[], None]], T]) -> T:
        """Run ``write(check)`` for ``worker``'s report into ``path``, noted first (a
        write that fails midway leaves nothing, its note is harmless). ``check()``
        raises GroupStoppedError once the worker's group is stopped: the write calls
        it between chunks. Raises GroupStoppedError at once if it already is."""

        def check() -> None:
            if self._workers.is_fenced(worker):
                raise _stopped(worker, path)

        with self._workers.running(worker, lambda: _stopped(worker, path)):
            self._note(worker, path)
            return write(check)

    def note(self, worker: str, path: str, make: Callable[[], None]) -> None:
        """Note ``path`` as a report of ``worker`` that the worker writes itself (torch
        DCP: each rank streams its files into it) and ``make()`` it, unless the
        worker's group is stopped (GroupStoppedError: then nothing is made, so no
        directory appears after ``reclaim`` deleted what it found)."""
        with self._workers.running(worker, lambda: _stopped(worker, path)):
            self._note(worker, path)
            make()

    def _note(self, worker: str, path: str) -> None:
        with self._lock:
            self._stored.setdefault(worker, set()).add(path)

    def reclaim(
        self,
        workers: Collection[str],
        tracked: Collection[str],
        delete: Callable[[str], None],
    ) -> list[str]:
        """Fence ``workers``, wait for their stores to end, and ``delete`` each path
        they stored that is not in ``tracked``; returns the paths deleted, sorted
        (one already gone, pruned by Train or never published, is skipped). Their
        notes are dropped."""
        self._workers.fence(workers)
        stored: set[str] = set()
        with self._lock:
            for w in workers:
                stored |= self._stored.pop(w, set())
        deleted = []
        for path in sorted(stored - set(tracked)):
            try:
                delete(path)
            except FileNotFoundError:
                continue
            deleted.append(path)
        return deleted


def _stopped(worker: str, path: str) -> GroupStoppedError:
    return GroupStoppedError(
        f"Ray Train stopped the worker group of {worker}; its report into {path!r} is not stored"
    )
