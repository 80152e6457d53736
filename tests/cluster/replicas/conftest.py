"""The replica tests' cluster: one mock cluster of 4 nodes for the whole package
(head and 3 workers), topped up again to 4 before each test that needs it, since
the tests remove nodes for good. A removed node is declared dead after 3 missed
health checks 0.5 s apart, not Ray's default 5 x 3 s. The replica registry's
background sweep of orphan placed blobs is off (``AIR_TRANSFER_PLACED_SWEEP_S=0``):
the tests that judge an orphan by hand must find it there; the one test of the
background sweep starts a registry of its own with it on."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer.core import environ
from tests.support.cluster import start_cluster
from tests.support.replicas import top_up

NODES = 4


@pytest.fixture(scope="package")
def replica_cluster() -> Iterator[Cluster]:
    had = os.environ.get(environ.PLACED_SWEEP_S)
    os.environ[environ.PLACED_SWEEP_S] = "0"  # before any process of the cluster starts
    c = start_cluster(
        "node_a",
        "node_b",
        "node_c",
        system_config={"health_check_period_ms": 500, "health_check_failure_threshold": 3},
    )
    yield c
    ray.shutdown()
    c.shutdown()
    if had is None:
        del os.environ[environ.PLACED_SWEEP_S]
    else:
        os.environ[environ.PLACED_SWEEP_S] = had


@pytest.fixture
def cluster4(replica_cluster: Cluster) -> Cluster:
    """The package's cluster with 4 live nodes."""
    top_up(replica_cluster, NODES)
    return replica_cluster
