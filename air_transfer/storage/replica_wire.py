"""Node storage replicas, what both rooms say to the registry: the calls it answers
(``RegistryCalls``, which the registry's class subclasses and callers name:
``replica_set.call(RegistryCalls.view, key)``), who makes a change (``Owner``, so
that a change whose caller died is resolved at once) and what state a copy is in
(``CopyState``, the answer of ``replica_status``).

The caller's side makes these and the registry, on the storage side, keeps them:
typed here, below both, so that neither imports the other.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from air_transfer.core.provided import Provided

#: The prefix of every replica record's key in the GCS key-value store (the registry
#: writes them; a drain reads which copy leads from them).
RECORD_PREFIX = "replicas/"
#: The prefix of a writer-placed storage's key in the same store: its value, the
#: settings its background pass needs (JSON: ``failure_domain``), written by its first
#: user; a storage without one is not writer-placed, and no pass looks into it.
PLACED_PREFIX = "placed/"
#: A copy's state: ``fresh`` (complete, read), ``syncing`` (being made again by
#: repair), ``stale`` (missed a change; repair makes it again), ``failing`` (repair
#: of it failed and is tried again later), ``failed`` (repair gave up on it: see
#: ``error``; a copy is made on another node if one is free).
State = Literal["fresh", "syncing", "stale", "failing", "failed"]
#: The caller side's pass over placed files (``placement="writer"``), which the
#: registry's actor runs when nodes are lost or will go: ``(storages as (key,
#: replica root template, K), live nodes, draining nodes) -> what failed``
#: (``storage.client.placed_keeper.keep_placed``, handed down by the package root).
PLACED_PASS: Provided[Callable[[list[tuple[str, str, int]], set[str], set[str]], list[str]]] = (
    Provided("the background pass over placed files")
)
#: The prefix of a claim on a placed blob's key in the same store (a repair of the
#: blob in progress: ``storage.server.placed_claims``).
CLAIM_PREFIX = "placed-claims/"
#: The caller side's sweep of orphan placed blobs whose writer died, which the
#: registry's actor runs at its own pace: ``(storages as (key, replica root template,
#: K)) -> what failed`` (``storage.client.placed_keeper.sweep_dead_writers``).
PLACED_SWEEP: Provided[Callable[[list[tuple[str, str, int]]], list[str]]] = Provided(
    "the background sweep of orphan placed blobs"
)
#: A copy: (node id, the root its files live under on that node).
Copy = tuple[str, str]
#: The answer of ``begin``: (op id, the copies to apply it to, the fresh ones).
Begun = tuple[str, list[Copy], list[str]]


def storage_key(node: str, root: str) -> str:
    """The key the registry knows a replicated storage by: its storage node and root."""
    return f"{node}:{root}"


def key_parts(key: str) -> Copy:
    """``(storage node, root)`` of a replicated storage's ``key``."""
    node, _, root = key.partition(":")
    return node, root


def on_copy(root: str, rel: str) -> str:
    """The path of relative path ``rel`` in the copy rooted at ``root``."""
    return posixpath.normpath(posixpath.join(root, rel)) if rel else root


@dataclass(frozen=True)
class Owner:
    """The process that made a change: its Ray worker id (a driver, task or actor)
    and node. Ray knows whether it lives; its change is resolved once it does not."""

    worker: str
    node: str

    def to_dict(self) -> dict[str, Any]:
        return {"worker": self.worker, "node": self.node}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Owner:
        return cls(worker=str(d["worker"]), node=str(d["node"]))


@dataclass(frozen=True)
class CopyState:
    """One copy of a replicated node storage, as the registry knows it."""

    node_id: str
    root: str
    state: State
    attempts: int = 0  # repairs of it that failed in a row
    error: str | None = None  # the last one's error


def drain_leader(fresh: Iterable[str], primary: str, leaving: Iterable[str] = ()) -> str | None:
    """Which copy's agent drains a replicated storage into its durable tier: the
    storage node's while its copy is fresh, else the first fresh copy by node id
    (None: no copy is fresh); a copy on a node that Ray says will go (``leaving``)
    only when no other is fresh. Both rooms apply this one rule: the drains, to tell
    whether they lead, and callers, to ask the leading one."""
    nodes = set(fresh)
    staying = nodes - set(leaving)
    nodes = staying or nodes
    if primary in nodes:
        return primary
    return min(nodes) if nodes else None


class RegistryCalls(Protocol):
    """What the cluster's replica registry answers callers
    (``storage.server.replica_registry.ReplicaRegistry`` says what each does)."""

    def register(
        self, key: str, copies: list[Copy], wanted: int, template: str, fresh: list[str] | None
    ) -> None: ...

    def view(self, key: str) -> tuple[list[Copy], list[str], list[str], int] | None: ...

    def keys(self) -> list[str]: ...

    def template(self, key: str) -> str: ...

    def resize(self, key: str, wanted: int) -> int: ...

    def status(self, key: str) -> list[CopyState]: ...

    def begin(
        self,
        key: str,
        paths: list[str],
        op: str | None = None,
        owner: Owner | None = None,
        staging: dict[str, str] | None = None,
    ) -> Begun | None: ...

    def end(self, key: str, op: str, missed: list[str], paths: list[str]) -> list[str]: ...

    def targets(self, key: str) -> tuple[list[Copy], list[str]]: ...

    def retry_failed(self, key: str) -> None: ...

    def claim_placed(self, key: str, blob: str, claim: str, owner: Owner) -> bool: ...

    def release_placed(self, key: str, blob: str, claim: str) -> None: ...

    def placed_claim(self, key: str, blob: str) -> tuple[str | None, int]: ...
