"""Start a transfer where its chunks will be owned: in this process, or (``owner="node"``)
in this node's agent, which submits the packing to itself.

What goes into the object store is the transferred checkpoint itself, a
``ChunkedCheckpoint`` wrapping the handle, so that a task given the ref receives a
checkpoint. That class sits above this layer (and above the agent, which calls this):
it is looked up by its dotted name, as ``cluster.nodes`` looks up the agent class.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

import ray

from air_transfer.cluster import leases
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import running_in_agent, this_node_id
from air_transfer.config import TransferConfig
from air_transfer.core.scan import Source
from air_transfer.transfer.handle import RAY_ERRORS, TransferHandle, raise_transfer_error, submit
from air_transfer.transfer.live_chunks import LiveChunks
from air_transfer.transfer.strategies import Registrations, registrations

#: The class a transferred checkpoint is stored as (imported on first use, by name).
CHECKPOINT_CLASS = "air_transfer.checkpoint:ChunkedCheckpoint"


@functools.cache
def _checkpoint_class() -> Any:
    module, _, name = CHECKPOINT_CLASS.partition(":")
    return getattr(importlib.import_module(module), name)


def submit_transfer(
    source: Source, config: TransferConfig | None = None
) -> tuple[ray.ObjectRef[Any], ray.ObjectRef[Any] | None, str]:
    """Start transferring ``source``: the ref of the transferred checkpoint (put by
    this process or, for ``owner="node"``, by this node's agent, which packs with
    this process's strategy registrations and holds the transfer until this process
    lets go of it: ``cluster.leases``), the ref of its completion (None if packing is
    done) and the name of the strategy packing it."""
    config = config or TransferConfig()
    if config.owner == "node" and not running_in_agent():
        agent = AgentClient()
        call = agent.submit_transfer(source, config, registrations(config), requester())
        try:
            ref, done, strategy, ids = ray.get(call)
        except RAY_ERRORS as e:  # FileNotFoundError, ManifestError... as themselves
            raise_transfer_error(None, f"the packing of {source.root!r} by the node agent", e)
        leases.hold(agent, ref.hex(), ids)
        return ref, done, strategy
    ref, done, handle = put_transfer(source, config)
    return ref, done, handle.strategy.name


def put_transfer(
    source: Source,
    config: TransferConfig,
    registered: Registrations | None = None,
    live: LiveChunks | None = None,
) -> tuple[ray.ObjectRef[Any], ray.ObjectRef[Any] | None, TransferHandle]:
    """Start packing ``source`` here (``handle.submit``, selecting among
    ``registered`` if given, reusing and recording ``live`` chunks if given) and put
    the transferred checkpoint: its ref, owned by this process, the ref of the
    completion (None if packed) and the handle."""
    handle, done = submit(source, config, registered, live)
    try:
        ref = ray.put(_checkpoint_class()._from_handle(handle))
    except BaseException:
        if live is not None:  # nobody can read it: offer none of its chunks again
            live.drop([handle.transfer_id])
        raise
    return ref, done, handle


def requester() -> tuple[int, str]:
    """This process as an agent's lease names it: pid and node id."""
    return os.getpid(), this_node_id()
