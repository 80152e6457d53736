"""Nodes of the cluster and their air-transfer agents, found by name.

Lower layers (the ``streamed`` strategy, ``owner="node"`` packing, node storage) need
the agent of some node, but must not import the agent actor, which sits above them
and composes their services. So the agent is looked up here by its actor name and,
when none runs yet, started from the class the package root hands down
(``AGENT_CLASS``, a ``core.provided`` slot): one per node, detached, pinned.
Ray's public API only.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from air_transfer.cluster import identity
from air_transfer.core.knobs import KNOBS
from air_transfer.core.node_names import NODE_ID, check_node_name, is_ip
from air_transfer.core.provided import Provided

logger = logging.getLogger(__name__)

#: The Ray namespace of every agent (so jobs in other namespaces share them).
NAMESPACE = "air_transfer"
#: The agent's class (``agent.NodeAgent``, above this layer), provided by the
#: package root and loaded on first start (see above).
AGENT_CLASS: Provided[type] = Provided("the node agent's class")
_NAME_PREFIX = "air-transfer-agent-"
#: The replica registry's actor name (``storage.client.replica_set``).
REGISTRY_NAME = "air-transfer-replicas"
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


def object_store_bytes(node_id: str) -> int | None:
    """The object store capacity of node ``node_id`` (None if the GCS does not
    list it)."""
    for n in ray.nodes():
        if n.get("NodeID") == node_id:
            capacity = n.get("Resources", {}).get("object_store_memory")
            return int(capacity) if capacity else None
    return None


def live_node_ids() -> set[str]:
    """Ids of the nodes the GCS considers alive."""
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def node_labels(key: str | None) -> dict[str, str]:
    """Label ``key``'s value on each live node that has it, by node id (none for
    None): where Ray says a node's failure domain is."""
    if key is None:
        return {}
    return {
        n["NodeID"]: str(n["Labels"][key])
        for n in ray.nodes()
        if n.get("Alive") and key in (n.get("Labels") or {})
    }


def head_node_id() -> str:
    """The id of the cluster's head node."""
    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {}):
            return str(n["NodeID"])
    raise RuntimeError("no live head node in this Ray cluster; pass node= explicitly")


#: What ``node=`` accepts, for error messages.
NODE_FORMS = (
    "a Ray node id (56 hex digits: ray.get_runtime_context().get_node_id(), "
    "ray.nodes()), a node's IP address, or 'head'"
)


def names_a_node_by_role_or_address(text: str) -> bool:
    """Whether ``text`` is ``"head"`` or an IP address: a node named otherwise than
    by its id, which ``resolve_node`` turns into one."""
    return text == "head" or is_ip(text)


def check_node_spec(node: object) -> str:
    """``node`` if it is written as a node can be named (a node id, an IP address or
    ``"head"``), else ValueError; Ray need not run (nothing is looked up)."""
    if isinstance(node, str) and node.startswith("/"):
        raise ValueError(
            f"node must be {NODE_FORMS}, got {node!r}; a storage path goes in "
            "RunConfig(storage_path=...) or root="
        )
    return check_node_name(node, NODE_FORMS)


def resolve_node(node: str) -> str:
    """The id of the live node ``node`` names (see ``check_node_spec``); ValueError
    naming the live nodes when none or several match. Needs Ray."""
    check_node_spec(node)
    if node == "head":
        return head_node_id()
    live = [n for n in ray.nodes() if n.get("Alive")]
    if NODE_ID.fullmatch(node):
        if any(n["NodeID"] == node for n in live):
            return node
        raise ValueError(
            f"node {node!r} is not a live node of this Ray cluster; live nodes: {_listing(live)}"
        )
    matches = [n for n in live if n.get("NodeManagerAddress") == node]
    if len(matches) == 1:
        return str(matches[0]["NodeID"])
    if not matches:
        raise ValueError(
            f"no live node of this Ray cluster has the IP address {node!r}; live nodes: "
            f"{_listing(live)}"
        )
    raise ValueError(
        f"{len(matches)} live nodes share the IP address {node!r} ({_listing(matches)}): "
        "pass node= one of their node ids"
    )


def _listing(nodes: list[dict[str, Any]]) -> str:
    return ", ".join(f"{n['NodeID']} at {n.get('NodeManagerAddress')}" for n in nodes) or "none"


@functools.cache
def _remote_agent_class() -> Any:
    # ray.remote at first use, not at import (Ray Tune's file_transfer does the
    # latter; it registers a remote class in every process that imports it).
    cls = AGENT_CLASS.get()
    # Concurrency groups can only be declared here, not in .options().
    remote: Any = ray.remote
    groups = {PACK_GROUP: KNOBS.pack_threads, RELAY_GROUP: KNOBS.relay_threads, HANDOVER_GROUP: 2}
    return remote(concurrency_groups=groups)(cls)


def node_agent(node_id: str | None = None) -> Any:
    """The agent actor of a node, started if needed, with this process's
    ``AIR_TRANSFER_*`` settings. Concurrent callers get the same actor
    (``get_if_exists``).

    Args:
        node_id: The node's Ray id (default: this process's node).

    Returns:
        The actor's handle (``operations/agents.md`` says what it serves).

    Raises:
        RuntimeError: The agent running there was started by another air-transfer
            version (``shutdown_agents`` ends it).
    """
    node_id = node_id or this_node_id()
    name = agent_name(node_id)
    handle = (
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
            **identity.runtime_env(),
        )
        .remote()
    )
    if running_in_agent() and (ray.get_runtime_context().get_actor_name() == name):
        return handle  # itself: it runs this code
    return identity.checked(handle, name)


def running_in_agent() -> bool:
    """Whether this process is a node agent (which packs in place, not via itself)."""
    ctx = ray.get_runtime_context()
    return bool(ctx.get_actor_id()) and (ctx.get_actor_name() or "").startswith(_NAME_PREFIX)


def shutdown_agents(timeout: float = 60.0) -> int:
    """End every node agent of the cluster, and the replica registry, and return once
    none runs.

    The agents and the registry are detached: they outlive the job that started them
    and serve later ones, keeping what they hold. An agent keeps the checkpoints it
    owns (``owner="node"``) while their requesters live, and those of a requester
    that died holding them until it ends; the chunks of recently read node-storage
    files and directories (up to ``TransferConfig.cache_bytes``); the index of stored
    chunks for incremental checkpoints; and its process (memory, one per node). The
    registry keeps only what it also saved in Ray's GCS (it is started again from
    that record). This frees all of it: checkpoints the agents own become
    unreadable (CheckpointLostError), so call it once no reader needs them, e.g. at
    the end of a job that used ``owner="node"``, or to replace agents started by
    another air-transfer version or with other settings. Files in node storage stay.
    The next call that needs an agent starts one. A drain into a durable tier stops
    with its agent and resumes when the node's agent starts again: call
    ``wait_durable`` first if the cluster is about to go.

    Args:
        timeout: Seconds to wait for them to end.

    Returns:
        How many agents were running.

    Raises:
        TimeoutError: One still runs ``timeout`` seconds after it was killed.
    """
    names = [agent_name(node_id) for node_id in live_node_ids()]
    running = [name for name in names if _actor(name) is not None]
    for name in [*running, REGISTRY_NAME]:
        actor = _actor(name)
        if actor is not None:
            ray.kill(actor)
    deadline = time.monotonic() + timeout
    while any(_actor(name) is not None for name in [*running, REGISTRY_NAME]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"air-transfer agents still running {timeout} s after kill")
        time.sleep(0.05)  # Ray frees a killed actor's name once its death is recorded
    global _generation
    _generation += 1
    identity.forget()
    logger.debug("air-transfer: shut down %d node agents", len(running))
    return len(running)


_generation = 0


def agents_generation() -> int:
    """How many times this process ended the agents (``shutdown_agents``): a
    connection made before the last time asks for the agent again."""
    return _generation


def _actor(name: str) -> Any:
    """The live actor named ``name`` in the library's namespace, or None."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None
