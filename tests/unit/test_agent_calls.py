"""Each call to a node agent or the replica registry is declared once, in a Protocol
(``cluster.rpc``): every Protocol a caller names is written by the class the actor
hosts, with the same parameters; the actor finds the service from the declared
method alone, and serves no method that no Protocol declares."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from air_transfer.agent import NodeAgent
from air_transfer.cluster.agent_client import AgentSelf
from air_transfer.cluster.nodes import HANDOVER_GROUP, PACK_GROUP, RELAY_GROUP
from air_transfer.cluster.rpc import Services, declared_calls, group_of, in_group, served
from air_transfer.cluster.transfer_leases import HeldTransfers
from air_transfer.storage.node_api import (
    NodeCheckpoints,
    NodeCopies,
    NodeDurable,
    NodeFiles,
    NodeIndexedUploads,
    NodeMetadata,
    NodeReads,
)
from air_transfer.storage.replica_wire import RegistryCalls
from air_transfer.storage.server.drain.tiered import TieredDisk
from air_transfer.storage.server.node_service import NodeStorageService
from air_transfer.storage.server.replica_registry import ReplicaRegistry
from air_transfer.storage.server.stream_uploads import StreamUploads
from air_transfer.storage.server.uploads import DiskUploads
from air_transfer.transfer.node_owned import NodeOwnedTransfers
from air_transfer.transfer.packing_service import PackingService
from air_transfer.transfer.relay import Relays

#: Each Protocol callers name, and the class that answers it in the actor.
WRITTEN_BY = [
    (AgentSelf, NodeAgent),
    (HeldTransfers, NodeOwnedTransfers),
    (NodeFiles, DiskUploads),
    (NodeCopies, NodeStorageService),
    (NodeReads, NodeStorageService),
    (NodeCheckpoints, NodeStorageService),
    (NodeMetadata, TieredDisk),
    (NodeDurable, TieredDisk),
    (NodeIndexedUploads, StreamUploads),
    (RegistryCalls, ReplicaRegistry),
]


def _methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in vars(cls).items()
        if inspect.isfunction(fn) and not name.startswith("_")
    }


@pytest.mark.parametrize(("protocol", "cls"), WRITTEN_BY, ids=lambda c: c.__name__)
def test_every_declared_call_is_written_with_its_parameters(protocol: type, cls: type) -> None:
    assert protocol in cls.__mro__  # a subclass: mypy holds it to the signatures
    for name, declared in _methods(protocol).items():
        written = inspect.signature(getattr(cls, name))
        assert getattr(cls, name) is not vars(protocol)[name], f"{cls.__name__}.{name} unwritten"
        assert list(written.parameters) == list(declared.parameters), f"{cls.__name__}.{name}"


def test_the_packing_and_relay_calls_run_in_their_groups() -> None:
    for name in (
        "pack_chunks",
        "checksum_chunks",
        "store_chunks",
        "checksum_stored",
        "pack_stream",
    ):
        assert group_of(getattr(PackingService, name)) == PACK_GROUP, name
    assert group_of(PackingService.packed) is None
    assert group_of(Relays.take) == RELAY_GROUP
    assert group_of(Relays.give) == HANDOVER_GROUP


class _Api(Protocol):
    def double(self, x: int) -> int: ...

    @in_group("g")
    def lines(self, n: int) -> list[str]: ...


class _Doubler(_Api):
    def double(self, x: int) -> int:
        return 2 * x

    def lines(self, n: int) -> list[str]:
        return ["line"] * n

    def undeclared(self) -> int:
        return 1


class _OtherApi(Protocol):
    def double(self, x: int) -> int: ...


class _Other(_OtherApi):
    def double(self, x: int) -> int:
        return x


def test_a_call_runs_on_the_service_whose_protocol_declares_it() -> None:
    services = Services(_Doubler(), _Other())
    assert services.call(_Api.double, 4) == 8
    assert services.call(_OtherApi.double, 4) == 4  # same name, another service
    assert list(services.stream(_Api.lines, 2)) == ["line", "line"]
    assert group_of(_Api.lines) == "g"


class _Counter:
    """A service whose callers may import it: its calls are its methods marked served."""

    @served
    def next(self, n: int) -> int:
        return n + 1

    def undeclared(self) -> int:
        return 0


def test_a_services_own_method_marked_served_is_a_call() -> None:
    services = Services(_Counter())
    assert services.call(_Counter.next, 1) == 2
    assert [name for name, _ in declared_calls(_Counter)] == ["next"]
    with pytest.raises(TypeError, match="serves"):
        services.call(_Counter.undeclared)


def test_a_method_no_protocol_declares_is_not_served() -> None:
    services = Services(_Doubler())
    for method in (_Doubler.undeclared, _Doubler.double, _OtherApi.double, print):
        with pytest.raises(TypeError, match="serves"):
            services.call(method)


def test_the_agent_serves_only_what_its_protocols_declare() -> None:
    """Node storage's counters and cache, the agent's own plumbing: not calls."""
    hosted = [NodeAgent, PackingService, Relays, NodeOwnedTransfers, NodeStorageService]
    hosted += [DiskUploads, TieredDisk, StreamUploads]
    served = {name for cls in hosted for name, _ in declared_calls(cls)}
    assert {"counters", "clear_cache", "call", "call_streaming", "touch"}.isdisjoint(served)
    assert {"read_counters", "waiting", "leases", "fs_info", "fs_commit_indexed"} <= served


def test_a_service_that_leaves_a_declared_call_unwritten_is_refused() -> None:
    class Lazy(_Api):
        def lines(self, n: int) -> list[str]:
            return []

    with pytest.raises(TypeError, match="does not write double"):
        Services(Lazy())


def test_one_service_hosted_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="served twice"):
        Services(_Doubler(), _Doubler())


def test_what_runs_for_a_call_is_what_the_host_wraps_around_it() -> None:
    seen: list[str] = []

    def around(declared: Callable[..., Any], bound: Callable[..., Any]) -> Callable[..., Any]:
        def logged(*args: Any) -> Any:
            seen.append(declared.__qualname__)
            return bound(*args)

        return logged

    assert Services(_Doubler(), around=around).call(_Api.double, 3) == 6
    assert seen == ["_Api.double"]
