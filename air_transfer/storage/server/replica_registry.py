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
apply it to) and ``end`` (which of them missed it). Two operations whose paths are
one or lie one inside the other (``d`` and ``d/x``) never run at once, so every
copy takes them in the same order. ``begin`` never waits: while the paths are held
it answers None and the caller asks again (``replica_set.begin``), in the order
they first asked, so that waiting never holds a thread that ``end`` needs. Repair
re-makes a copy while writes go on: the paths written while it syncs are noted,
copied again, and the copy is fresh only once a pass found no write in flight and
none since (``finish_sync``, checked under the same lock as ``begin``).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace

from air_transfer.storage.replica_wire import Begun, Copy, CopyState, Owner, RegistryCalls, State
from air_transfer.storage.server.placed_claims import ClaimCalls, PlacedClaims
from air_transfer.storage.server.replica_record import BUSY_S, Failure, Op, Replicated, Store

#: A caller waiting for a path that has not asked again for this long has given up.
WAITER_S = 10.0

__all__ = ["BUSY_S", "Begun", "Copy", "ReplicaRegistry", "overlap"]


def overlap(a: list[str], b: list[str]) -> bool:
    """Whether two operations on paths ``a`` and ``b`` (relative; '' is the root)
    touch a common path: one path is the other or lies inside it."""
    return any(_related(x, y) for x in a for y in b)


def _related(x: str, y: str) -> bool:
    return x == y or not x or not y or y.startswith(x + "/") or x.startswith(y + "/")


class ReplicaRegistry(ClaimCalls, RegistryCalls):
    """The copies of every replicated node storage of the cluster (thread-safe);
    with a ``store``, each change is saved there before it returns, and the
    records saved there are loaded at start (``replica_record``). It holds the claims
    on placed blobs too (``placed_claims``; by default, in memory, owners never dead)."""

    def __init__(self, store: Store | None = None, claims: PlacedClaims | None = None) -> None:
        self.placed_claims = claims or PlacedClaims(lambda owner: True)
        self._lock = threading.Lock()
        self._store = store
        self._storages: dict[str, Replicated] = {}
        if store is not None:
            self._storages = {k: Replicated.from_record(r) for k, r in store.load_all().items()}
        #: Per storage, the operations waiting for their paths, in the order they
        #: first asked: op -> (paths, when it last asked).
        self._waiting: dict[str, dict[str, tuple[list[str], float]]] = {}

    def _save(self, key: str) -> None:
        """Save storage ``key``'s record (under the lock, so saves keep its order)."""
        if self._store is not None:
            self._store.save(key, self._storages[key].to_record())

    def register(
        self, key: str, copies: list[Copy], wanted: int, template: str, fresh: list[str] | None
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

    def template(self, key: str) -> str:
        with self._lock:
            return self._storages[key].template

    def resize(self, key: str, wanted: int) -> int:
        """Keep storage ``key`` on ``wanted`` copies if that is more than it has
        (repair makes the new ones); the K it had."""
        with self._lock:
            s = self._storages[key]
            had = s.wanted
            if wanted > had:
                s.wanted = wanted
                self._save(key)
            return had

    def status(self, key: str) -> list[CopyState]:
        """Every member copy of storage ``key`` and its state."""
        with self._lock:
            s = self._storages[key]
            out = []
            for node, root in s.roots.items():
                f = s.failures.get(node)
                state: State
                if node in s.fresh:
                    state = "fresh"
                elif node in s.syncing:
                    state = "syncing"
                elif f is None:
                    state = "stale"
                else:
                    state = "failed" if f.given_up else "failing"
                attempts, error = (f.attempts, f.error) if f else (0, None)
                out.append(CopyState(node, root, state, attempts, error))
            return out

    def begin(
        self,
        key: str,
        paths: list[str],
        op: str | None = None,
        owner: Owner | None = None,
        staging: dict[str, str] | None = None,
    ) -> Begun | None:
        """Start operation ``op`` (the caller's id, so that a call retried on a
        registry started again is the same operation; default: a new one) on
        ``paths``, made by ``owner`` (its staging file on each copy, for a commit):
        its id, the copies to apply it to (fresh and syncing), and which of them
        are fresh (their answer is the storage's). None while an operation on an
        overlapping path runs or waits ahead of it: ask again."""
        op = op or uuid.uuid4().hex
        with self._lock:
            s = self._storages[key]
            known = s.ops.get(op)
            if known is None:
                if self._held(key, s, op, list(paths)):
                    return None
                targets = sorted(s.fresh | set(s.syncing))
                known = s.ops[op] = Op(
                    targets, sorted(s.fresh), list(paths), time.time(), owner, dict(staging or {})
                )
                for touched in s.syncing.values():
                    touched.update(paths)
                self._save(key)
            copies = [(n, s.roots[n]) for n in known.targets if n in s.roots]
            return op, copies, list(known.fresh)

    def _held(self, key: str, s: Replicated, op: str, paths: list[str]) -> bool:
        """Whether ``op`` must wait: an operation in flight, or one that asked
        before it and still asks, overlaps its paths. If so it is in line."""
        now = time.monotonic()
        line = self._waiting.setdefault(key, {})
        for gone in [o for o, (_, seen) in line.items() if now - seen > WAITER_S]:
            del line[gone]
        ahead = False
        for other, (other_paths, _) in line.items():
            if other == op:
                break
            if overlap(paths, other_paths):
                ahead = True
                break
        if ahead or any(overlap(paths, o.paths) for o in s.ops.values()):
            line[op] = (paths, now)  # keeps its place in line if it had one
            return True
        line.pop(op, None)
        return False

    def waiting(self, key: str) -> int:
        """How many operations wait for their paths (for tests and diagnosis)."""
        with self._lock:
            return len(self._waiting.get(key, {}))

    def end(self, key: str, op: str, missed: list[str], paths: list[str]) -> list[str]:
        """The operation ``op`` is done; the copies in ``missed`` did not take it
        (they are stale now, saved so before this returns; a repeated call is
        harmless). Returns the fresh copies after it."""
        with self._lock:
            s = self._storages[key]
            s.ops.pop(op, None)
            for node in missed:
                s.fresh.discard(node)
                s.syncing.pop(node, None)
            for touched in s.syncing.values():
                touched.update(paths)
            self._save(key)
            return sorted(s.fresh)

    def in_flight(self) -> list[tuple[str, str, Op]]:
        """``(key, op id, op)`` of every operation in flight (copies)."""
        with self._lock:
            return [
                (key, op, replace(rec, staging=dict(rec.staging)))
                for key, s in self._storages.items()
                for op, rec in s.ops.items()
            ]

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
    def under_replicated(
        self, live: set[str], leaving: frozenset[str] = frozenset()
    ) -> list[tuple[str, int, int]]:
        """``(key, fresh copies that stay, K)`` of each storage with fewer than K: a
        copy on a node that Ray says will go (``leaving``) does not count."""
        with self._lock:
            out = []
            for key, s in self._storages.items():
                have = len(s.fresh & (live - leaving))
                if have < s.wanted:
                    out.append((key, have, s.wanted))
            return out

    def missing_bytes(self, live: set[str], key: str | None = None) -> int:
        """Bytes short of K copies: per storage (every one, or ``key``), its size
        times the copies missing."""
        with self._lock:
            storages = [self._storages[key]] if key else list(self._storages.values())
            return sum(s.nbytes * max(0, s.wanted - len(s.fresh & live)) for s in storages)

    def plan_repair(
        self, key: str, live: set[str], leaving: frozenset[str] = frozenset()
    ) -> tuple[Copy, Copy] | None:
        """The next copy to re-make: ``(source, target)``, a fresh live source and a
        live node that is not a fresh copy (a stale member first, else a node that is
        no member, which takes a dead member's place), or None. A member whose repair
        failed is tried again in its turn (``Failure.retry_at``); only once it is
        given up on is a node that is no member taken instead. A node that Ray says
        will go (``leaving``) is never a target and its copy does not count towards
        K, but serves as a source while it lives: its copy is made elsewhere before
        it goes. The target is syncing from here on: writes go to it."""
        with self._lock:
            s = self._storages[key]
            now = time.time()
            staying = live - leaving
            fresh = s.fresh & live
            if not fresh or len(fresh & staying) >= s.wanted or s.syncing:
                return None
            sources = sorted(fresh & staying) + sorted(fresh & leaving)
            behind = [n for n in sorted(s.roots) if n in staying and n not in s.fresh]
            stale = [n for n in behind if s.repairable(n, now)]
            pending = [n for n in behind if not s.failures[n].given_up] if not stale else []
            others = sorted(n for n in staying - set(s.roots) if s.repairable(n, now))
            if stale:
                target = stale[0]
            elif pending:  # its next try comes: a node of its own is not given up lightly
                return None
            elif others:
                target = others[0]
                s.roots[target] = s.template.format(node_id=target)
            else:
                return None
            for dead in [n for n in s.roots if n not in live]:  # gone for good: Ray never
                if len(s.roots) > s.wanted:  # reuses a node id
                    del s.roots[dead]
                    s.fresh.discard(dead)
                    s.failures.pop(dead, None)
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
            return touched, bool(s.ops)

    def finish_sync(self, key: str, node: str) -> bool:
        """Make syncing copy ``node`` fresh if nothing was written since the last
        ``take_touched`` and nothing is in flight; else False (take them again)."""
        with self._lock:
            s = self._storages[key]
            if s.syncing.get(node) or s.ops or node not in s.syncing:
                return False
            del s.syncing[node]
            s.fresh.add(node)
            s.failures.pop(node, None)
            self._save(key)
            return True

    def abandon_sync(self, key: str, node: str) -> None:
        """Repair of ``node`` stopped (it missed a write meanwhile): it stays stale."""
        with self._lock:
            self._storages[key].syncing.pop(node, None)

    def repair_failed(self, key: str, node: str, error: str) -> Failure:
        """Repair of ``node`` failed with ``error``: it stays stale, and is tried
        again later, or given up on after ``MAX_ATTEMPTS`` (saved: a state the
        user reads with ``status``)."""
        with self._lock:
            s = self._storages[key]
            s.syncing.pop(node, None)
            last = s.failures.get(node)
            f = s.failures[node] = Failure((last.attempts if last else 0) + 1, error, time.time())
            self._save(key)
            return f

    def retry_failed(self, key: str) -> None:
        """Forget the failed repairs of storage ``key``: each copy is tried again
        (when its storage is made again, by a user who may have fixed the cause)."""
        with self._lock:
            s = self._storages[key]
            if s.failures:
                s.failures.clear()
                self._save(key)
