"""Each call to a node agent or the replica registry is declared once, by a method
of the service that answers it (``cluster.rpc``): every Protocol a caller names is
written by the class the actor hosts, with the same parameters, and the actor finds
the service from the method alone, refusing one it does not host."""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

from air_transfer.agent import NodeAgent
from air_transfer.cluster.agent_client import AgentSelf
from air_transfer.cluster.nodes import HANDOVER_GROUP, PACK_GROUP, RELAY_GROUP
from air_transfer.cluster.rpc import Services, group_of, in_group
from air_transfer.cluster.transfer_leases import HeldTransfers
from air_transfer.storage.node_api import (
    NodeCheckpoints,
    NodeDurable,
    NodeFiles,
    NodeIndexedUploads,
    NodeReads,
)
from air_transfer.storage.replica_wire import RegistryCalls
from air_transfer.storage.server.node_service import NodeStorageService
from air_transfer.storage.server.replica_registry import ReplicaRegistry
from air_transfer.storage.server.stream_uploads import StreamUploads
from air_transfer.transfer.node_owned import NodeOwnedTransfers
from air_transfer.transfer.packing_service import PackingService
from air_transfer.transfer.relay import Relays

#: Each Protocol callers name, and the class that answers it in the actor.
WRITTEN_BY = [
    (AgentSelf, NodeAgent),
    (HeldTransfers, NodeOwnedTransfers),
    (NodeFiles, NodeStorageService),
    (NodeReads, NodeStorageService),
    (NodeCheckpoints, NodeStorageService),
    (NodeDurable, NodeStorageService),
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


class _Doubler(_Api):
    def double(self, x: int) -> int:
        return 2 * x

    @in_group("g")
    def lines(self, n: int) -> list[str]:
        return ["line"] * n


class _Other:
    def double(self, x: int) -> int:
        return x


def test_a_call_runs_on_the_service_whose_method_it_names() -> None:
    services = Services(_Doubler(), _Other())
    assert services.call(_Api.double, 4) == 8  # the Protocol's method: its writer's
    assert services.call(_Doubler.double, 4) == 8
    assert services.call(_Other.double, 4) == 4  # same name, another service
    assert list(services.stream(_Doubler.lines, 2)) == ["line", "line"]
    assert group_of(_Doubler.lines) == "g"


def test_a_method_of_no_hosted_service_is_refused() -> None:
    services = Services(_Doubler())
    with pytest.raises(TypeError, match="serves"):
        services.call(_Other.double, 1)
    with pytest.raises(TypeError, match="serves"):
        services.call(print, 1)  # not a method of any service


def test_a_service_that_leaves_a_declared_call_unwritten_is_refused() -> None:
    class Lazy(_Api):
        pass

    with pytest.raises(TypeError, match="does not write double"):
        Services(Lazy())


def test_one_service_hosted_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="served twice"):
        Services(_Doubler(), _Doubler())
