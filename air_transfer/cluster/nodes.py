"""Nodes of the cluster and their air-transfer agents, found by name.

Lower layers (the ``streamed`` strategy, ``owner="node"`` packing, node storage) need
the agent of some node, but must not import the agent actor, which sits above them
and composes their services. So the agent is looked up here by its actor name and,
when none runs yet, its class is imported by its dotted name (fsspec resolves its
``known_implementations`` the same way) and started: one per node, detached, pinned.
Ray's public API only.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from air_transfer.core.knobs import KNOBS

logger = logging.getLogger(__name__)

#: The Ray namespace of every agent (so jobs in other namespaces share them).
NAMESPACE = "air_transfer"
#: Where the agent class lives: imported on first start, by name (see above).
AGENT_CLASS = "air_transfer.agent:NodeAgent"
_NAME_PREFIX = "air-transfer-agent-"
#: The agent's concurrency group for packing tasks (``KNOBS.pack_threads`` threads).
PACK_GROUP = "pack"
#: The agent's concurrency groups for relays: the waits (``KNOBS.relay_threads``
#: threads), and the hand-overs that end them (instant; their own threads, so that
#: no other call, nor the waits themselves, can hold them up).
RELAY_GROUP = "relay"
HANDOVER_GROUP = "relay-handover"


def agent_name(node_id: str) -> str:
    """The actor name of the agent of ``node_id``."""
    return f"{_NAME_PREFIX}{node_id}"


def this_node_id() -> str:
    """The id of the node this process runs on."""
    return str(ray.get_runtime_context().get_node_id())


def live_node_ids() -> set[str]:
    """Ids of the nodes the GCS considers alive."""
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def head_node_id() -> str:
    """The id of the cluster's head node."""
    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {}):
            return str(n["NodeID"])
    raise RuntimeError("no live head node in this Ray cluster; pass node= explicitly")


@functools.cache
def _remote_agent_class() -> Any:
    # ray.remote at first use, not at import (Ray Tune's file_transfer does the
    # latter; it registers a remote class in every process that imports it).
    module, _, name = AGENT_CLASS.partition(":")
    cls = getattr(importlib.import_module(module), name)
    # Concurrency groups can only be declared here, not in .options().
    remote: Any = ray.remote
    groups = {PACK_GROUP: KNOBS.pack_threads, RELAY_GROUP: KNOBS.relay_threads, HANDOVER_GROUP: 2}
    return remote(concurrency_groups=groups)(cls)


def node_agent(node_id: str | None = None) -> Any:
    """The agent actor of ``node_id`` (default: this process's node), started if
    needed. Concurrent callers get the same actor (``get_if_exists``)."""
    node_id = node_id or this_node_id()
    return (
        _remote_agent_class()
        .options(
            name=agent_name(node_id),
            namespace=NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=KNOBS.agent_max_concurrency,
            # Never re-run pack or stream work after a failure: a re-run silently
            # re-reads files that may have changed (every chunk is verified anyway).
            max_restarts=0,
            max_task_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        .remote()
    )


def running_in_agent() -> bool:
    """Whether this process is a node agent (which packs in place, not via itself)."""
    ctx = ray.get_runtime_context()
    return bool(ctx.get_actor_id()) and (ctx.get_actor_name() or "").startswith(_NAME_PREFIX)


def shutdown_agents() -> int:
    """Kill every node agent of the cluster; returns how many were running.

    Checkpoints they own become unreadable (CheckpointLostError), so call this once
    no reader needs them, e.g. at the end of a job that used ``owner="node"``.
    """
    killed = 0
    for node_id in live_node_ids():
        try:
            actor = ray.get_actor(agent_name(node_id), namespace=NAMESPACE)
        except ValueError:
            continue
        ray.kill(actor)
        killed += 1
    logger.debug("air-transfer: shut down %d node agents", killed)
    return killed
