"""Naming a node on a cluster of several: ``storage_filesystem(node=...)`` takes a
node id, ``"head"`` or an IP address and refuses, naming the live nodes, one that
is ambiguous or not there; DCP's storage classes without a filesystem refuse to
guess whose disk to use (each rank would use its own node's) and say what to pass.
"""

from __future__ import annotations

import pytest
import ray

from air_transfer import storage_filesystem
from tests.support.cluster import node_ids

pytestmark = pytest.mark.usefixtures("cluster")


def test_head_names_the_head_node_and_ids_name_themselves() -> None:
    ids = node_ids()
    assert storage_filesystem(node="head").handler.node_id == ids["head"]
    assert storage_filesystem(node=ids["node_b"]).handler.node_id == ids["node_b"]
    with pytest.raises(ValueError, match=rf"'{'ab' * 28}' is not a live node.*{ids['node_a']}"):
        storage_filesystem(node="ab" * 28)


def test_an_ip_shared_by_several_nodes_or_by_none_is_refused() -> None:
    """The mock cluster's nodes share one address: which of them would be a guess."""
    address = ray.util.get_node_ip_address()
    ids = node_ids()
    with pytest.raises(ValueError, match=r"3 live nodes share the IP address") as shared:
        storage_filesystem(node=address)
    assert all(node in str(shared.value) for node in ids.values())
    with pytest.raises(ValueError, match=r"no live node .* has the IP address '10\.255\.0\.9'"):
        storage_filesystem(node="10.255.0.9")
    with pytest.raises(ValueError, match="no live node"):
        storage_filesystem(node=ids["node_a"], replicas=2, replica_nodes=("10.255.0.9",))


@pytest.mark.parametrize("cls", ["NodeStorageWriter", "NodeStorageReader"])
def test_dcp_storage_outside_train_refuses_to_guess_the_node(cls: str) -> None:
    """Defect: each defaulted to node storage of the process's own node, so the
    ranks of a save on several nodes scattered their shards, and only a restore
    failed."""
    import air_transfer.dcp

    with pytest.raises(ValueError, match=r"3 live nodes.*its own node's disk.*node=\"head\""):
        getattr(air_transfer.dcp, cls)("/ckpt")
