"""Agents of other air-transfer versions, as a cluster that outlived an upgrade has
them running: started under the agent's name so that callers find them."""

from __future__ import annotations

import os
from typing import Any

import ray

from air_transfer.agent import NodeAgent
from air_transfer.cluster.identity import Identity
from air_transfer.cluster.nodes import (
    HANDOVER_GROUP,
    NAMESPACE,
    PACK_GROUP,
    RELAY_GROUP,
    agent_name,
)

#: The version the other agent says it runs.
OTHER_VERSION = "0.0.1+other"


class OtherVersionAgent(NodeAgent):
    """Today's agent in all but the version it runs."""

    def identity(self) -> Identity:
        return Identity(OTHER_VERSION, {})


class PreIdentityAgent:
    """An agent from before agents said which version they run."""

    def pid(self) -> int:
        return os.getpid()


def start_as_agent(cls: type, node_id: str) -> Any:
    """Start ``cls`` as the agent of ``node_id`` (none may run there), ready."""
    groups = {PACK_GROUP: 1, RELAY_GROUP: 1, HANDOVER_GROUP: 1}  # the agent's methods'
    actor = (
        ray.remote(concurrency_groups=groups)(cls)
        .options(name=agent_name(node_id), namespace=NAMESPACE, lifetime="detached", num_cpus=0)
        .remote()
    )
    ray.get(actor.pid.remote())
    return actor
