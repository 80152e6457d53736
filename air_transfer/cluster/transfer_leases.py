"""Transfer leases, a process's hold on the transfers an agent packed for it: how a
checkpoint packed with ``owner="node"`` outlives the worker that asked for it,
whatever that worker did with its ref before it died.

Ray counts the references to an object as a tree: a process that passes on a ref it
borrowed tells the owner about the new holders only once it lets go of the ref
itself (ray-project/ray#18456). A worker that hands the ref of a node-owned
checkpoint to an evaluator and dies still holding it takes that report with it, and
the agent, the owner, frees the checkpoint under the evaluator. So the agent holds
every transfer it packs for another process (a lease, ``HeldTransfers``)
until that process references none of the transfer's refs any more: this module, in
that process, checks its own reference table every ``KNOBS.lease_poll_s`` on one
daemon thread and tells the agent which leases to drop (by then Ray has that
process's report of every holder it passed a ref to). A process that dies holding
them leaves its leases in place: the agent keeps those transfers until
``shutdown_agents()``. Refs of a lease that a later lease still held also covers (a
transfer reusing an earlier one's chunks nests them) do not count for the earlier.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Protocol

from air_transfer.cluster import _ray_core
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.core.knobs import KNOBS
from air_transfer.core.threads import Periodic

logger = logging.getLogger(__name__)


class HeldTransfers(Protocol):
    """What a node agent answers of the transfers it holds for other processes
    (``transfer.node_owned``, above this layer)."""

    def release(self, *keys: str) -> None:
        """Drop the leases ``keys``: each transfer then lives as long as Ray counts
        a reference to it, and no later transfer reuses its chunks."""

    def leases(self) -> dict[str, tuple[int, str] | None]:
        """The transfers held for another process: lease key -> requester (pid,
        node); a requester that died leaves its leases until ``shutdown_agents()``."""
        ...


#: Lease key (the transfer's ref, hex) -> (the agent holding it, the hex ids of the
#: refs of the transfer: while this process references any, the lease stays).
_leases: dict[str, tuple[AgentClient, frozenset[str]]] = {}
_lock = threading.Lock()


def hold(agent: AgentClient, key: str, ids: Iterable[str]) -> None:
    """Keep the lease ``key`` of ``agent`` until this process references none of
    ``ids`` (the transfer's ref and those nested in it) any more."""
    with _lock:
        _leases[key] = (agent, frozenset([key, *ids]))
    _watcher.start()


def held() -> int:
    """How many leases this process holds."""
    with _lock:
        return len(_leases)


def _tick() -> None:
    present = _ray_core.referenced_ids()
    with _lock:
        if present is None:  # not connected any more: to the agents, it is gone
            done = {}
            _leases.clear()
        else:
            done = _done(present)
            for key in done:
                del _leases[key]
    _release(done)


def _idle() -> bool:
    with _lock:  # none left: the thread ends, and the next hold() starts another
        return not _leases


def _done(present: set[str]) -> dict[str, AgentClient]:
    """The leases this process can let go of (key -> agent): those whose refs it
    references none of, not counting refs that a later lease of the same agent
    still held also covers. A transfer reusing an earlier one's chunks
    (``reuse_chunks``) nests them, and the agent holding the later transfer keeps
    them alive: referencing them through the later one must not hold the earlier
    one (and its other chunks) for as long as the later one lives."""
    done: dict[str, AgentClient] = {}
    covered: dict[str, set[str]] = {}  # agent's node -> the refs of its later leases kept
    for key, (agent, ids) in reversed(_leases.items()):  # latest first
        later = covered.setdefault(agent.node_id, set())
        if (ids - later).isdisjoint(present):
            done[key] = agent
        else:
            later |= ids
    return done


def _release(done: dict[str, AgentClient]) -> None:
    """Tell each agent which of its leases to drop (one call per agent; an agent
    that is gone has dropped them)."""
    by_agent: dict[AgentClient, list[str]] = {}
    for key, agent in done.items():
        by_agent.setdefault(agent, []).append(key)
    for agent, keys in by_agent.items():
        try:
            agent.call(HeldTransfers.release, *keys)
        except Exception as e:
            logger.debug("air-transfer: could not release leases %s: %r", keys, e)


_watcher = Periodic("air-transfer-leases", lambda: KNOBS.lease_poll_s, _tick, _idle)
