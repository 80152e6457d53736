"""Mock multi-node clusters (``ray.cluster_utils.Cluster``: real raylets on one
machine) for the cluster and end-to-end tiers, and the check that every test on one
gets: nothing it transferred stays pinned in an object store.

Nodes are told apart by custom resources (``node_a``, ``node_b``); the driver runs on
the head. Object stores are small so that spilling and streaming limits are reached
with a few hundred MB.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import ray
from ray.cluster_utils import Cluster

from air_transfer.cluster._ray_core import object_store_free_bytes
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import NAMESPACE, agent_name
from air_transfer.cluster.transfer_leases import HeldTransfers
from air_transfer.config import ZONE_LABEL
from tests.support import shared_ray
from tests.support.procs import REPO_ROOT
from tests.support.s3 import free_port
from tests.support.waiting import eventually

MiB = 1024 * 1024
STORE_BYTES = 128 * MiB


def start_cluster(
    *node_names: str,
    system_config: dict[str, object] | None = None,
    node_resources: dict[str, float] | None = None,
    dashboard: bool = False,
    labels: dict[str, dict[str, str]] | None = None,
) -> Cluster:
    """A head (the driver's node, resource ``head``) plus one node per name, each
    with that name as a resource and ``node_resources`` (e.g. a resource that only
    workers ask for); the driver connected, its workers importing ``tests.support``.
    Whatever Ray the suite shares is stopped first (``tests.support.shared_ray``).

    With ``dashboard`` the head runs Ray's dashboard (its job server and State API)
    at ``http://{cluster.webui_url}``, on a free port, as its dashboard agent is (two
    clusters on one machine never meet there), both picked anew at each try.
    ``labels``: Ray node labels by node name (``head`` too)."""
    shared_ray.release()
    head: dict[str, object] = {
        "num_cpus": 1,
        "resources": {"head": 1},
        "object_store_memory": STORE_BYTES,
        "include_dashboard": dashboard,
        "labels": (labels or {}).get("head", {}),
    }
    if system_config:
        head["_system_config"] = system_config
    tried: list[Cluster] = []

    def start() -> Cluster:
        cluster = Cluster()
        tried.append(cluster)
        if dashboard:
            head.update(dashboard_port=free_port(), dashboard_agent_listen_port=free_port())
        cluster.add_node(**head)
        for name in node_names:
            resources = {name: 1.0, **(node_resources or {})}
            cluster.add_node(
                num_cpus=1,
                resources=resources,
                object_store_memory=STORE_BYTES,
                labels=(labels or {}).get(name, {}),
            )
        cluster.wait_for_nodes()
        connect(cluster.address)
        return cluster

    def stop() -> None:  # what the failed start left, so that the next starts afresh
        ray.shutdown()
        tried[-1].shutdown()

    return shared_ray.start_with_retries(start, stop)


def connect(address: str) -> None:
    """Connect this process to the cluster at ``address`` as its driver (again, after
    a test that called ``ray.shutdown()``)."""
    ray.init(
        address=address,
        logging_level="ERROR",
        runtime_env={"env_vars": {"PYTHONPATH": REPO_ROOT}},
    )


#: The shared cluster's nodes besides the head; each also offers ``trainer``, the
#: resource Train's workers ask for, so that they never run on the driver's node.
SHARED_NODES = ("node_a", "node_b")
#: What each of them offers besides its name: ``trainer``, and the resource that
#: ``examples/torch_dcp.py`` puts its workers on where a cluster offers it, so that
#: the example runs on this cluster as a user's script runs on theirs.
WORKER_RESOURCES = {"trainer": 1.0, "examples_dcp_worker_node": 1.0}
#: The shared cluster's failure domains, as a cloud's zones are labelled: the head
#: and ``node_a`` in one, ``node_b`` in another.
SHARED_ZONES = {
    name: {ZONE_LABEL: zone}
    for name, zone in (("head", "zone-1"), ("node_a", "zone-1"), ("node_b", "zone-2"))
}


def shared_cluster() -> Cluster:
    """The head (the driver's node, resource ``head``) plus ``node_a`` and ``node_b``
    (each also ``trainer``), this process connected: the one the suite shares
    (``tests.support.shared_ray``), started if none is held or the held one lost a
    node, or was shut down."""
    held = shared_ray.held_cluster()
    if held is not None and _intact(held):
        return held
    cluster = start_cluster(*SHARED_NODES, node_resources=WORKER_RESOURCES, labels=SHARED_ZONES)
    shared_ray.hold_cluster(cluster)
    return cluster


def _intact(cluster: Cluster) -> bool:
    """Whether every node of the shared cluster lives, this process connected to it."""
    try:
        if not ray.is_initialized():
            connect(cluster.address)
        elif ray.get_runtime_context().gcs_address != cluster.address:
            return False
        return set(node_ids()) >= {"head", *SHARED_NODES}
    except Exception:  # a cluster that cannot be reached is not intact
        return False


def two_node_cluster() -> Iterator[Cluster]:
    """The body of the ``cluster`` fixtures: the shared cluster (``shared_cluster``),
    kept for the next module when this one is done."""
    yield shared_cluster()


def node_ids() -> dict[str, str]:
    """Custom resource name ("head", "node_a", ...) -> node id, for live nodes."""
    out = {}
    for node in ray.nodes():
        if node["Alive"]:
            for name in node["Resources"]:
                if name == "head" or name.startswith("node_"):
                    out[name] = node["NodeID"]
    return out


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


def exited(pid: int) -> bool:
    """Whether the process ``pid`` has exited: gone, or a zombie that its parent has
    not reaped yet (a worker that ``ray.kill`` ended stays one for a while, and
    ``os.kill(pid, 0)`` still finds it)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def release_dead_requesters_leases() -> dict[str, dict[str, tuple[int, str] | None]]:
    """A node agent holds a transfer it packed for a process that died holding its
    refs until ``shutdown_agents()``, by design (``cluster.transfer_leases``): a test that
    killed such a process lets go of them here (the mock cluster's processes all run
    on this machine, so a pid tells whether the requester still lives). The leases
    left, by node name, for a failure to name."""
    left: dict[str, dict[str, tuple[int, str] | None]] = {}
    for name, node_id in node_ids().items():
        try:
            agent = AgentClient(node_id, ray.get_actor(agent_name(node_id), namespace=NAMESPACE))
            leases = ray.get(agent.call(HeldTransfers.leases))
        except (ValueError, ray.exceptions.RayActorError):
            continue
        dead = [key for key, by in leases.items() if by is not None and exited(by[0])]
        with contextlib.suppress(ray.exceptions.RayActorError):
            ray.get(agent.call(HeldTransfers.release, *dead))
        if alive := {key: by for key, by in leases.items() if key not in dead}:
            left[name] = alive
    return left


def chunks_back_to_baseline() -> Iterator[None]:
    """The body of the autouse ``no_chunks_left_pinned`` fixtures: after the test,
    every node's object store returns to its baseline (nothing a test transferred
    stays pinned once its checkpoints and refs are gone).

    A requester the test killed may exit only while this waits (Ray ends a killed
    worker asynchronously), so its leases are looked for again on every poll."""
    if not ray.is_initialized():
        yield
        return
    address = ray.get_runtime_context().gcs_address
    before = {name: object_store_free_bytes(nid) for name, nid in node_ids().items()}
    yield
    if not ray.is_initialized() or ray.get_runtime_context().gcs_address != address:
        return  # the test let go of this Ray (an example starting a cluster of its own)
    gc.collect()
    release_read_caches()
    seen: dict[str, object] = {}

    def short() -> dict[str, tuple[int, int]]:
        """Node name -> (free bytes now, at the start) for nodes below baseline."""
        live = node_ids()
        below = {}
        for name, free in before.items():
            if free is not None and name in live:
                now = object_store_free_bytes(live[name]) or 0
                if now < free - 4 * MiB:
                    below[name] = (now, free)
        return below

    def back_to_baseline() -> bool:
        if not (below := short()):
            return True
        seen.update(below=below, leases=release_dead_requesters_leases())
        return False

    eventually(
        back_to_baseline,
        lambda: f"freeing every chunk after the test (last seen: {seen})",
    )
