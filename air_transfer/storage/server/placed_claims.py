"""Node storage with ``placement="writer"``, repairs of one placed file made one at a
time across the cluster: the replica registry holds a *claim* per blob
(``PlacedClaims``), which every repair (the registry's background pass, a user's
``repair_holders``, from any process or node) takes before it reads the file's
record and gives back when its copies, swap and deletes are done.

Why a claim and not the registry's changes: a change holds the file's path for the
whole copy of its blob (minutes for a large one), and every write, move or delete
of it, and the sweep's hold of the whole storage, would wait as long. Why per blob,
not per path: a repair copies and deletes a blob's copies by the blob's name, which a
move keeps. Why in the registry: it is the one process every repair already asks
(its stub swap is a change), it outlives callers, and its claims are saved in the
cluster's GCS key-value store (``ClaimStore``), so that one started again knows them.

A claim's owner is the process that took it (``Owner``); a claim whose owner Ray
says is dead, or whose node is gone (``Alive``), is taken by the next that asks: a
repair killed mid-way never holds its file for good. A caller that may not take it
asks again (``placed_claim.claimed``); those asking are counted (``waiting``). Plain
Python.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from air_transfer.storage.replica_wire import Owner

#: A caller that has not asked again for a claim for this long is not counted.
ASKED_S = 10.0

#: ``alive(owner)``: whether the process that took a claim may still be running.
Alive = Callable[[Owner], bool]


class ClaimStore(Protocol):
    """Where the claims are saved: ``"<storage key>\\n<blob>"`` -> the claim's JSON."""

    def save(self, name: str, value: bytes) -> None: ...

    def delete(self, name: str) -> None: ...

    def load_all(self) -> dict[str, bytes]: ...


@dataclass(frozen=True)
class Claim:
    """Who repairs a blob now: the claim's id (one per repair), its owner, since when."""

    id: str
    owner: Owner
    since: float

    def encode(self) -> bytes:
        d = {"id": self.id, "owner": self.owner.to_dict(), "since": self.since}
        return json.dumps(d).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Claim:
        d = json.loads(raw)
        return cls(str(d["id"]), Owner.from_dict(d["owner"]), float(d["since"]))


def _name(key: str, blob: str) -> str:
    return f"{key}\n{blob}"


class PlacedClaims:
    """The claims on placed blobs (thread-safe); with a ``store``, each claim is
    saved there before it is granted and those saved there are loaded at start."""

    def __init__(self, alive: Alive, store: ClaimStore | None = None) -> None:
        self._alive = alive
        self._store = store
        self._lock = threading.Lock()
        self._held: dict[str, Claim] = {}
        if store is not None:
            self._held = {n: Claim.decode(v) for n, v in store.load_all().items()}
        self._asked: dict[str, dict[str, float]] = {}  # name -> claim id -> last ask

    def claim(self, key: str, blob: str, claim: str, owner: Owner) -> bool:
        """Whether claim ``claim`` of ``owner`` now holds ``blob`` of storage ``key``:
        True if it did already, or none held it, or its holder is dead (replaced)."""
        name, now = _name(key, blob), time.time()
        with self._lock:
            held = self._held.get(name)
        # Asked of Ray outside the lock: the other callers need not wait on it.
        dead = held is not None and held.id != claim and not self._alive(held.owner)
        with self._lock:
            current = self._held.get(name)
            if current is not None and current.id == claim:
                return True
            if current is not None and not (dead and current == held):
                self._asked.setdefault(name, {})[claim] = now
                return False
            taken = Claim(claim, owner, now)
            if self._store is not None:
                self._store.save(name, taken.encode())
            self._held[name] = taken
            self._asked.get(name, {}).pop(claim, None)
            return True

    def release(self, key: str, blob: str, claim: str) -> None:
        """Claim ``claim`` on ``blob`` given back (nothing if another holds it now)."""
        name = _name(key, blob)
        with self._lock:
            held = self._held.get(name)
            if held is None or held.id != claim:
                return
            del self._held[name]
            if self._store is not None:
                self._store.delete(name)
            if not self._asked.get(name):
                self._asked.pop(name, None)

    def state(self, key: str, blob: str) -> tuple[str | None, int]:
        """The id of the claim that holds ``blob`` (None: free) and how many other
        claims asked for it within ``ASKED_S``."""
        name, now = _name(key, blob), time.time()
        with self._lock:
            held = self._held.get(name)
            asked = self._asked.get(name, {})
            for claim in [c for c, at in asked.items() if now - at > ASKED_S]:
                del asked[claim]
            return (held.id if held else None), len(asked)


class ClaimCalls:
    """The replica registry's calls on claims (declared by ``RegistryCalls``), over
    its ``placed_claims``."""

    placed_claims: PlacedClaims

    def claim_placed(self, key: str, blob: str, claim: str, owner: Owner) -> bool:
        """Whether ``claim`` (of ``owner``) now holds the repair of placed ``blob`` of
        storage ``key``."""
        return self.placed_claims.claim(key, blob, claim, owner)

    def release_placed(self, key: str, blob: str, claim: str) -> None:
        """``claim`` on placed ``blob`` given back, its repair done or failed."""
        self.placed_claims.release(key, blob, claim)

    def placed_claim(self, key: str, blob: str) -> tuple[str | None, int]:
        """The claim holding placed ``blob`` (None: free) and how many others ask."""
        return self.placed_claims.state(key, blob)
