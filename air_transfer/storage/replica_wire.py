"""Node storage replicas, what both rooms say to the registry: who makes a change
(``Owner``, so that a change whose caller died is resolved at once) and what state a
copy is in (``CopyState``, the answer of ``replica_status``).

The caller's side makes these and the registry, on the storage side, keeps them:
typed here, below both, so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

#: A copy's state: ``fresh`` (complete, read), ``syncing`` (being made again by
#: repair), ``stale`` (missed a change; repair makes it again), ``failing`` (repair
#: of it failed and is tried again later), ``failed`` (repair gave up on it: see
#: ``error``; a copy is made on another node if one is free).
State = Literal["fresh", "syncing", "stale", "failing", "failed"]


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


def drain_leader(fresh: Iterable[str], primary: str) -> str | None:
    """Which copy's agent drains a replicated storage into its durable tier: the
    storage node's while its copy is fresh, else the first fresh copy by node id
    (None: no copy is fresh). Both rooms apply this one rule: the drains, to tell
    whether they lead, and callers, to ask the leading one."""
    nodes = set(fresh)
    if primary in nodes:
        return primary
    return min(nodes) if nodes else None
