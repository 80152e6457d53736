"""Node storage replicas, the record: which nodes hold a complete copy of each
replicated storage, and which copies a write is going to.

One registry runs per cluster, on the head node (``ReplicaRegistry``, hosted by an
actor: see ``storage.client.replica_set``); it outlives any storage node, and losing
the head loses the cluster anyway. A storage is known by its key (its first storage
node and root). Each copy is ``fresh`` (complete: it took every write since it was
made), ``syncing`` (being re-made by repair: writes go to it, reads do not) or
neither (stale: it missed a write or a delete, and is never read again until repair
has made it again). A copy is marked stale before the write it missed returns, so a
read that starts after a write never reads a copy without it.

Every operation that changes a storage is bracketed by ``begin`` (which copies to
apply it to) and ``end`` (which of them missed it). Repair re-makes a copy while
writes go on: the paths written while it syncs are noted, copied again, and the copy
is fresh only once a pass found no write in flight and none since (``finish_sync``,
checked under the same lock as ``begin``).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

#: How long an operation may hold its paths (and count as in flight) before the
#: registry takes its writer for dead.
BUSY_S = 300.0
#: A copy: (node id, the root its files live under on that node).
Copy = tuple[str, str]


@dataclass
class Replicated:
    """The state of one replicated storage."""

    wanted: int  # K: how many complete copies it should have
    roots: dict[str, str]  # node -> root, for every member copy
    fresh: set[str]
    template: str  # the root of a copy on a node that joins later ({node_id})
    syncing: dict[str, set[str]] = field(default_factory=dict)  # node -> paths touched
    in_flight: dict[int, set[str]] = field(default_factory=dict)  # op -> its targets
    started: dict[int, float] = field(default_factory=dict)  # op -> when
    bytes: int = 0  # what the storage holds, as its last repair or write counted


class ReplicaRegistry:
    """The copies of every replicated node storage of the cluster (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._storages: dict[str, Replicated] = {}
        self._ops = itertools.count(1)
        self._paths = threading.Condition(self._lock)
        self._busy: dict[tuple[str, str], float] = {}  # path being committed -> since

    def register(self, key: str, copies: list[Copy], wanted: int, template: str) -> None:
        """Record a new storage with ``copies`` (all complete: they are empty, or the
        storage existed with one copy before); a known key keeps its record."""
        with self._lock:
            if key not in self._storages:
                roots = dict(copies)
                self._storages[key] = Replicated(wanted, roots, set(roots), template)

    def view(self, key: str) -> tuple[list[Copy], list[str], list[str], int] | None:
        """``(every member copy, the fresh ones, the syncing ones, K)``; None for an
        unknown key."""
        with self._lock:
            s = self._storages.get(key)
            if s is None:
                return None
            return list(s.roots.items()), sorted(s.fresh), sorted(s.syncing), s.wanted

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._storages)

    def begin(self, key: str, paths: list[str]) -> tuple[int, list[Copy], list[str]]:
        """Start an operation on ``paths``: its id, the copies to apply it to (fresh
        and syncing), and which of them are fresh (their answer is the storage's)."""
        with self._lock:
            # One commit of a path at a time, so every copy takes its versions in the
            # same order (a writer that died mid-commit lets go after BUSY_S).
            names = [(key, p) for p in paths]
            while any(time.monotonic() - self._busy.get(n, -BUSY_S) < BUSY_S for n in names):
                self._paths.wait(1.0)
            now = time.monotonic()
            self._busy.update((n, now) for n in names)
            s = self._storages[key]
            op = next(self._ops)
            targets = s.fresh | set(s.syncing)
            s.in_flight[op] = targets
            s.started[op] = now
            for touched in s.syncing.values():
                touched.update(paths)
            copies = [(n, s.roots[n]) for n in sorted(targets)]
            return op, copies, sorted(s.fresh)

    def end(self, key: str, op: int, missed: list[str], paths: list[str]) -> list[str]:
        """The operation ``op`` is done; the copies in ``missed`` did not take it
        (they are stale now). Returns the fresh copies after it."""
        with self._lock:
            for p in paths:
                self._busy.pop((key, p), None)
            self._paths.notify_all()
            s = self._storages[key]
            s.in_flight.pop(op, None)
            s.started.pop(op, None)
            for node in missed:
                s.fresh.discard(node)
                s.syncing.pop(node, None)
            for touched in s.syncing.values():
                touched.update(paths)
            return sorted(s.fresh)

    def targets(self, key: str) -> tuple[list[Copy], list[str]]:
        """The copies a write starting now stages on (fresh and syncing), and the
        fresh ones."""
        with self._lock:
            s = self._storages[key]
            nodes = sorted(s.fresh | set(s.syncing))
            return [(n, s.roots[n]) for n in nodes], sorted(s.fresh)

    def note_bytes(self, key: str, nbytes: int) -> None:
        with self._lock:
            self._storages[key].bytes = nbytes

    # -- repair ------------------------------------------------------------------------
    def under_replicated(self, live: set[str]) -> list[tuple[str, int, int]]:
        """``(key, fresh live copies, K)`` of each storage with fewer than K."""
        with self._lock:
            out = []
            for key, s in self._storages.items():
                have = len(s.fresh & live)
                if have < s.wanted:
                    out.append((key, have, s.wanted))
            return out

    def missing_bytes(self, live: set[str], key: str | None = None) -> int:
        """Bytes short of K copies: per storage (every one, or ``key``), its size
        times the copies missing."""
        with self._lock:
            storages = [self._storages[key]] if key else list(self._storages.values())
            return sum(s.bytes * max(0, s.wanted - len(s.fresh & live)) for s in storages)

    def plan_repair(self, key: str, live: set[str]) -> tuple[Copy, Copy] | None:
        """The next copy to re-make: ``(source, target)``, a fresh live source and a
        live node that is not a fresh copy (a stale member first, else a node that is
        no member, which takes a dead member's place), or None. The target is
        syncing from here on: writes go to it."""
        with self._lock:
            s = self._storages[key]
            sources = sorted(s.fresh & live)
            if not sources or len(sources) >= s.wanted or s.syncing:
                return None
            stale = sorted(n for n in s.roots if n in live and n not in s.fresh)
            others = sorted(live - set(s.roots))
            if stale:
                target = stale[0]
            elif others:
                target = others[0]
                s.roots[target] = s.template.format(node_id=target)
            else:
                return None
            for dead in [n for n in s.roots if n not in live]:  # gone for good: Ray never
                if len(s.roots) > s.wanted:  # reuses a node id
                    del s.roots[dead]
                    s.fresh.discard(dead)
            s.syncing[target] = set()
            return (sources[0], s.roots[sources[0]]), (target, s.roots[target])

    def take_touched(self, key: str, node: str) -> tuple[set[str], bool] | None:
        """The paths written since the last call for syncing copy ``node``, and
        whether an operation is in flight; None if it is no longer syncing."""
        with self._lock:
            s = self._storages[key]
            if node not in s.syncing:
                return None
            touched, s.syncing[node] = s.syncing[node], set()
            for op in [o for o, t in s.started.items() if time.monotonic() - t > BUSY_S]:
                s.in_flight.pop(op, None)  # its writer died mid-operation
                s.started.pop(op, None)
            return touched, bool(s.in_flight)

    def finish_sync(self, key: str, node: str) -> bool:
        """Make syncing copy ``node`` fresh if nothing was written since the last
        ``take_touched`` and nothing is in flight; else False (take them again)."""
        with self._lock:
            s = self._storages[key]
            if s.syncing.get(node) or s.in_flight or node not in s.syncing:
                return False
            del s.syncing[node]
            s.fresh.add(node)
            return True

    def abandon_sync(self, key: str, node: str) -> None:
        """Repair of ``node`` failed: it stays stale."""
        with self._lock:
            self._storages[key].syncing.pop(node, None)
