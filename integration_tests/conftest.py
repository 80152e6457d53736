"""A mock multi-node cluster (``ray.cluster_utils.Cluster``: real raylets, one machine)
shared by the tests of a module. Nodes are told apart by custom resources."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray
from ray.cluster_utils import Cluster

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def two_node_cluster() -> Iterator[Cluster]:
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"node_a": 1},
            "object_store_memory": 256 * MiB,
            "include_dashboard": False,
        },
    )
    cluster.add_node(num_cpus=1, resources={"node_b": 1}, object_store_memory=256 * MiB)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR")
    yield cluster
    ray.shutdown()
    cluster.shutdown()
