"""Node storage replicas, the record: which nodes hold a complete copy of each
replicated storage, and which copies a write is going to.

One registry runs per cluster, on the head node (``ReplicaRegistry``, hosted by an
actor: see ``storage.client.replica_set``); it outlives any storage node, and losing
the head loses the cluster anyway. Its record outlives the actor: each change is
saved in the cluster's GCS before it returns, and a registry started again (by the
next caller) loads it (``replica_record``). A storage is known by its key (its first storage
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

import threading
import time
import uuid

from air_transfer.storage.server.replica_record import BUSY_S, Op, Replicated, Store

#: A copy: (node id, the root its files live under on that node).
Copy = tuple[str, str]

__all__ = ["BUSY_S", "Copy", "ReplicaRegistry"]


class ReplicaRegistry:
    """The copies of every replicated node storage of the cluster (thread-safe);
    with a ``store``, each change is saved there before it returns, and the
    records saved there are loaded at start (``replica_record``)."""

    def __init__(self, store: Store | None = None) -> None:
        self._lock = threading.Lock()
        self._store = store
        self._storages: dict[str, Replicated] = {}
        if store is not None:
            self._storages = {k: Replicated.from_record(r) for k, r in store.load_all().items()}
        self._paths = threading.Condition(self._lock)

    def _save(self, key: str) -> None:
        """Save storage ``key``'s record (under the lock, so saves keep its order)."""
        if self._store is not None:
            self._store.save(key, self._storages[key].to_record())

    def register(
        self,
        key: str,
        copies: list[Copy],
        wanted: int,
        template: str,
        fresh: list[str] | None = None,
    ) -> None:
        """Record a new storage with ``copies``, of which ``fresh`` (default: all)
        are complete (the others are stale: repair makes them again); a known key
        keeps its record."""
        with self._lock:
            if key not in self._storages:
                roots = dict(copies)
                complete = set(roots) if fresh is None else set(fresh) & set(roots)
                self._storages[key] = Replicated(wanted, roots, complete, template)
                self._save(key)

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

    def begin(
        self, key: str, paths: list[str], op: str | None = None
    ) -> tuple[str, list[Copy], list[str]]:
        """Start operation ``op`` (the caller's id, so that a call retried on a
        registry started again is the same operation; default: a new one) on
        ``paths``: its id, the copies to apply it to (fresh and syncing), and which
        of them are fresh (their answer is the storage's)."""
        op = op or uuid.uuid4().hex
        with self._lock:
            s = self._storages[key]
            known = s.ops.get(op)
            if known is None:
                # One commit of a path at a time, so every copy takes its versions in
                # the same order (a writer that died mid-commit lets go after BUSY_S).
                while any(set(paths) & set(o.paths) for o in s.live_ops().values()):
                    self._paths.wait(1.0)
                targets = sorted(s.fresh | set(s.syncing))
                known = s.ops[op] = Op(targets, sorted(s.fresh), list(paths), time.time())
                for touched in s.syncing.values():
                    touched.update(paths)
                self._save(key)
            copies = [(n, s.roots[n]) for n in known.targets if n in s.roots]
            return op, copies, list(known.fresh)

    def end(self, key: str, op: str, missed: list[str], paths: list[str]) -> list[str]:
        """The operation ``op`` is done; the copies in ``missed`` did not take it
        (they are stale now, saved so before this returns; a repeated call is
        harmless). Returns the fresh copies after it."""
        with self._lock:
            self._paths.notify_all()
            s = self._storages[key]
            s.ops.pop(op, None)
            for node in missed:
                s.fresh.discard(node)
                s.syncing.pop(node, None)
            for touched in s.syncing.values():
                touched.update(paths)
            self._save(key)
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
            self._storages[key].nbytes = nbytes

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
            return sum(s.nbytes * max(0, s.wanted - len(s.fresh & live)) for s in storages)

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
            self._save(key)
            return (sources[0], s.roots[sources[0]]), (target, s.roots[target])

    def take_touched(self, key: str, node: str) -> tuple[set[str], bool] | None:
        """The paths written since the last call for syncing copy ``node``, and
        whether an operation is in flight; None if it is no longer syncing."""
        with self._lock:
            s = self._storages[key]
            if node not in s.syncing:
                return None
            touched, s.syncing[node] = s.syncing[node], set()
            return touched, bool(s.live_ops())

    def finish_sync(self, key: str, node: str) -> bool:
        """Make syncing copy ``node`` fresh if nothing was written since the last
        ``take_touched`` and nothing is in flight; else False (take them again)."""
        with self._lock:
            s = self._storages[key]
            if s.syncing.get(node) or s.live_ops() or node not in s.syncing:
                return False
            del s.syncing[node]
            s.fresh.add(node)
            self._save(key)
            return True

    def abandon_sync(self, key: str, node: str) -> None:
        """Repair of ``node`` failed: it stays stale."""
        with self._lock:
            self._storages[key].syncing.pop(node, None)
