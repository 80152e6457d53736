"""Mock multi-node clusters (``ray.cluster_utils.Cluster``: real raylets on one
machine) shared by the tests of a module, and the checks every cluster test gets.

Nodes are told apart by custom resources (``node_a``, ``node_b``); the driver runs on
the head. Object stores are small so that spilling and streaming limits are reached
with a few hundred MB.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer._ray import object_store_free_bytes
from air_transfer.nodes import NAMESPACE, agent_name

sys.path.insert(0, os.path.dirname(__file__))

# Ray Train's controller polls its workers every 2 s, and a run ends (and a report
# made right after another returns) only at a poll: poll every 0.2 s in the tests'
# Train runs. Set before any Ray starts here, so every Ray process inherits it.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")

MiB = 1024 * 1024
STORE_BYTES = 128 * MiB


def start_cluster(*node_names: str, system_config: dict[str, object] | None = None) -> Cluster:
    if ray.is_initialized():
        ray.shutdown()
    head: dict[str, object] = {
        "num_cpus": 1,
        "resources": {"head": 1},
        "object_store_memory": STORE_BYTES,
        "include_dashboard": False,
    }
    if system_config:
        head["_system_config"] = system_config
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for name in node_names:
        cluster.add_node(num_cpus=1, resources={name: 1}, object_store_memory=STORE_BYTES)
    cluster.wait_for_nodes()
    connect(cluster.address)
    return cluster


def connect(address: str) -> None:
    """Connect this process to the cluster at ``address`` as its driver (again, after
    a test that called ``ray.shutdown()``)."""
    ray.init(
        address=address,
        logging_level="ERROR",
        runtime_env={"env_vars": {"PYTHONPATH": os.path.dirname(__file__)}},
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Head (driver) plus nodes ``node_a`` and ``node_b``."""
    c = start_cluster("node_a", "node_b")
    yield c
    ray.shutdown()
    c.shutdown()


def node_ids() -> dict[str, str]:
    """Custom resource name ("head", "node_a", ...) -> node id, for live nodes."""
    out = {}
    for node in ray.nodes():
        if node["Alive"]:
            for name in node["Resources"]:
                if name == "head" or name.startswith("node_"):
                    out[name] = node["NodeID"]
    return out


def eventually(check: Callable[[], bool], what: str, limit_s: float = 30) -> None:
    """Wait for something Ray does asynchronously (freeing objects, reporting
    resources), with a deadline instead of a fixed sleep."""
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {limit_s} s")
        gc.collect()
        time.sleep(0.1)


def release_read_caches() -> None:
    """Node agents keep the chunks of node-storage files read recently (by design:
    ``TransferConfig.cache_bytes``); a test's reads should not count against the next."""
    for node_id in node_ids().values():
        try:
            agent = ray.get_actor(agent_name(node_id), namespace=NAMESPACE)
        except ValueError:
            continue
        with contextlib.suppress(ray.exceptions.RayActorError):
            ray.get(agent.clear_read_cache.remote())


def release_dead_requesters_leases() -> None:
    """A node agent holds a transfer it packed for a process that died holding its
    refs until ``shutdown_agents()``, by design (``air_transfer.leases``): a test that
    killed such a process lets go of them here (the mock cluster's processes all run
    on this machine, so a pid tells whether the requester still lives)."""
    import psutil

    for node_id in node_ids().values():
        try:
            agent = ray.get_actor(agent_name(node_id), namespace=NAMESPACE)
            leases = ray.get(agent.leases.remote())
        except (ValueError, ray.exceptions.RayActorError):
            continue
        dead = [key for key, requester in leases.items() if not psutil.pid_exists(requester[0])]
        with contextlib.suppress(ray.exceptions.RayActorError):
            ray.get(agent.release.remote(*dead))


@pytest.fixture(autouse=True)
def no_chunks_left_pinned(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, every node's object store returns to its baseline: nothing a
    test transferred stays pinned once its checkpoints and refs are gone (and the
    processes that asked for node-owned ones are, or let go of them)."""
    if not ray.is_initialized():
        yield
        return
    before = {name: object_store_free_bytes(nid) for name, nid in node_ids().items()}
    yield
    gc.collect()
    release_read_caches()
    release_dead_requesters_leases()

    def back_to_baseline() -> bool:
        live = node_ids()
        return all(
            name not in live or (object_store_free_bytes(live[name]) or 0) >= free - 4 * MiB
            for name, free in before.items()
            if free is not None
        )

    eventually(back_to_baseline, "freeing every chunk after the test")
