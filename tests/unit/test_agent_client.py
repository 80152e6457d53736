"""The typed client mirrors the agent: every method the library may call on a node's
agent has an ``AgentClient`` method with the same parameters, so mypy's check of each
call to the client is a check of the call to the agent."""

from __future__ import annotations

import inspect

from air_transfer.agent import NodeAgent
from air_transfer.cluster.agent_client import AgentClient

#: Agent methods that only tests and tools call on the actor handle directly, and
#: ``identity``, which ``cluster.identity`` asks of the handle before any client uses it
#: (of any version's agent, and of the replica registry alike).
NOT_IN_CLIENT = {"node_id", "disk_read", "identity"}
#: Client arguments the agent does not take: how the call is made, not what it does.
CALL_OPTIONS = {"window"}
#: What Ray adds to every actor method's signature once the class has been made an
#: actor in this process (its tracing context): not a parameter of ours.
RAY_ADDED = {"_ray_trace_ctx"}


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in vars(cls).items()
        if callable(fn) and not name.startswith("_")
    }


def test_every_agent_method_has_a_client_method_and_back() -> None:
    agent, client = _public(NodeAgent), _public(AgentClient)
    assert set(agent) - NOT_IN_CLIENT == set(client)


def test_client_methods_take_the_agents_parameters() -> None:
    agent, client = _public(NodeAgent), _public(AgentClient)
    for name, signature in client.items():
        theirs = [p for p in agent[name].parameters if p not in ("self", *RAY_ADDED)]
        ours = [p for p in signature.parameters if p not in ("self", *CALL_OPTIONS)]
        if name == "packed":  # the agent takes the checksums spread, the client a list
            assert theirs == ["checksums"] and ours == ["checksums"], name
            continue
        assert ours == theirs, f"AgentClient.{name}{ours} != NodeAgent.{name}{theirs}"
