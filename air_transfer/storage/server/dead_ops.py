"""Node storage replicas, changes whose caller died mid-way: resolved as soon as Ray
knows of the death, so that the copies agree again and the paths are free.

A caller killed between its commits on two copies leaves the new version on one
and the old on the other, both fresh, its staging file on the second, and its
paths held in the registry. Every operation records its caller (``Owner``); the
registry's thread asks Ray (``_ray_core.worker_alive``, the caller's node among the
live ones) for each operation in flight, and resolves those of the dead:

1. fence it on every live copy (``OpFence``): none of its calls still queued or
   running lands afterwards;
2. remove its staging files;
3. take one fresh copy as it is now (the storage node's first) and make the op's
   paths on every other fresh copy what they are there (``Copier.sync``: the change
   is rolled forward on all, or back on all; its caller never heard which). A copy
   that cannot be fenced or synced is marked stale, as one that missed a change;
4. end it, which frees its paths (and repair, which waits for no op in flight).

An operation whose caller is unknown (a record saved by an older version) is taken
for dead after ``BUSY_S``, as before.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.storage.node_api import NodeCopies, NodeFiles
from air_transfer.storage.replica_wire import key_parts
from air_transfer.storage.server.repair import Copier, Pace, get, repair_rate
from air_transfer.storage.server.replica_record import BUSY_S, Op
from air_transfer.storage.server.replica_registry import ReplicaRegistry

logger = logging.getLogger(__name__)

#: An operation younger than this is not asked about (most end well before).
GRACE_S = 1.0
#: How long a copy's agent may take to finish a dead caller's calls running there.
FENCE_S = 30.0

#: ``alive(worker id)``: True, False, or None when Ray cannot tell.
Alive = Callable[[str], bool | None]


def caller_dead(op: Op, live: set[str], alive: Alive, now: float) -> bool:
    """Whether the process that runs ``op`` is known to be dead."""
    if op.owner is None:
        return op.expired(now)
    if op.owner.node not in live:
        return True
    answer = alive(op.owner.worker)
    return answer is False or (answer is None and now - op.started > BUSY_S)


def resolve_dead(registry: ReplicaRegistry, live: set[str], alive: Alive) -> int:
    """Resolve every operation in flight whose caller died; how many."""
    now, done = time.time(), 0
    for key, op_id, op in registry.in_flight():
        if now - op.started < GRACE_S or not caller_dead(op, live, alive, now):
            continue
        resolve(registry, key, op_id, op, live)
        done += 1
    return done


def resolve(registry: ReplicaRegistry, key: str, op_id: str, op: Op, live: set[str]) -> None:
    """Make the copies agree on what operation ``op_id`` changed, then end it."""
    view = registry.view(key)
    if view is None:
        return
    copies, fresh, _, _ = view
    roots = dict(copies)
    who = f"worker {op.owner.worker[:12]} on node {op.owner.node[:12]}" if op.owner else "unknown"
    logger.warning(
        "air-transfer: the caller of a change of %s in node storage %s died mid-way (%s); "
        "making its copies agree",
        ", ".join(op.paths) or "the root",
        key,
        who,
    )
    targets = [n for n in op.targets if n in roots and n in live]
    settled = []
    for node in targets:
        try:
            if not get(AgentClient(node).call(NodeCopies.fence_ops, [op_id], FENCE_S)):
                settled.append(node)
        except Exception as e:  # its agent is gone: the copy is too
            logger.debug("air-transfer: could not fence %s on %s: %r", op_id, node, e)
    for node in settled:
        staging = op.staging.get(node)
        if staging is not None:
            with contextlib.suppress(Exception):
                get(AgentClient(node).call(NodeFiles.fs_abort, roots[node], staging))
    primary, _ = key_parts(key)
    order = sorted(settled, key=lambda n: (n != primary, n))
    sources = [n for n in order if n in fresh]
    missed = [n for n in op.targets if n not in settled]
    if sources:
        source = sources[0]
        pace = Pace(repair_rate())
        for node in [n for n in sources[1:]]:
            copier = Copier((source, roots[source]), (node, roots[node]), pace)
            try:
                for path in sorted(op.paths):
                    if path:
                        copier.sync(path)
                    else:  # the root: what is not on the source goes too
                        copier.empty_target()
                        copier.sync("")
            except Exception as e:
                logger.warning(
                    "air-transfer: could not make the copy on %s agree (%s: %s); it is stale",
                    node[:12],
                    type(e).__name__,
                    e,
                )
                missed.append(node)
    registry.end(key, op_id, missed, op.paths)
