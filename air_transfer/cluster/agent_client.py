"""``AgentClient``: the one typed door to a node's agent.

A call names a method a Protocol declares, and its arguments
(``AgentClient(node).call(PackingService.pack_stream, source, plans)``): mypy checks
them against that one signature (``cluster.rpc``), and the agent runs it on the
service it hosts that writes it. Nothing about a call is written here: adding one is
declaring it in a Protocol and writing it in the service. A call returns what Ray's
``.remote()`` returns (an ObjectRef, several, or a streaming generator): callers
decide when to wait. The agent sits above this layer; it is reached by its actor name
(``nodes.node_agent``), never imported. ``AgentSelf`` declares what the agent answers of itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Concatenate, Protocol, TypeVar

import ray

from air_transfer.cluster import _ray_core
from air_transfer.cluster.identity import Identity
from air_transfer.cluster.nodes import node_agent, this_node_id
from air_transfer.cluster.rpc import P, R, S, group_of
from air_transfer.core.process_locks import ProcessLock

#: Node storage's wire types live in ``storage.node_wire``; these two stay only for
#: ``storage.durable.reads``, until it imports them from there.
Info = tuple[int, int | None, int | None]
Listed = tuple[str, int, int | None, int | None]

Ref = ray.ObjectRef[Any]
T = TypeVar("T")


class AgentSelf(Protocol):
    """What a node agent answers of itself (``agent.NodeAgent``, above this layer)."""

    def node_id(self) -> str: ...

    def pid(self) -> int: ...

    def identity(self) -> Identity:
        """The air-transfer version and settings the agent runs with (callers refuse
        an agent of another version: ``cluster.identity``)."""
        ...

    def read_counters(self) -> dict[str, int]:
        """What node storage cost this node and what packing did (bytes read, served,
        held, packed, reused; transfers packed and relayed, checkpoints stored; chunks
        and bytes copied here for relays)."""
        ...

    def incremental_counters(self) -> dict[str, int]:
        """What the agent's incremental stores reused and received, summed."""
        ...

    def clear_read_cache(self) -> None:
        """Let go of every cached node-storage chunk and directory transfer."""

    def dead_processes(self, locks: list[ProcessLock]) -> list[ProcessLock]:
        """Those of ``locks`` (of the node's processes) whose process is dead."""
        ...


class AgentClient:
    """Calls to the agent of node ``node_id`` (default: this process's node), started
    if none runs yet."""

    def __init__(self, node_id: str | None = None, actor: Any = None) -> None:
        self.node_id = node_id or this_node_id()
        self.actor: Any = actor if actor is not None else node_agent(self.node_id)

    def call(
        self, method: Callable[Concatenate[S, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> ray.ObjectRef[R]:
        """``method(*args, **kwargs)`` on the agent's service that has it: its ref."""
        ref: ray.ObjectRef[R] = self._remote(method).remote(method, *args, **kwargs)
        return ref

    def calls(
        self,
        count: int,
        method: Callable[Concatenate[S, P], object],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> list[Ref]:
        """``call``, for a method that returns ``count`` objects: their refs."""
        refs = self._remote(method, num_returns=count).remote(method, *args, **kwargs)
        return [refs] if count == 1 else list(refs)  # one return: a ref, not a list

    def stream(
        self,
        window: int,
        method: Callable[Concatenate[S, P], Iterator[T]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> ray.ObjectRefGenerator:
        """``call``, for a method that yields: a streaming generator of the objects
        it yields, at most ``window`` ahead of its reader."""
        return _ray_core.streaming(self.actor.call_streaming, window).remote(
            method, *args, **kwargs
        )

    def _remote(self, method: Callable[..., Any], **options: Any) -> Any:
        """The agent's ``call`` with Ray's ``options``, in the concurrency group the
        method runs in, named after the method (what Ray's dashboard shows)."""
        group = group_of(method)
        if group is not None:
            options["concurrency_group"] = group
        return self.actor.call.options(name=f"NodeAgent:{method.__qualname__}", **options)
