"""The machine and the Ray a run measures on: an embedded Ray (one node, or two on
this machine), the object store's size, the page cache and first-touch costs, and a
description of the machine for the report."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psutil
import ray

import air_transfer
from benchmarks.bench.data import GB
from benchmarks.units import GiB, MiB

#: Ray's default, said explicitly: the raylet maps its object store without faulting it
#: in. ``preallocate_plasma_memory`` faults in (``MAP_POPULATE``) the whole store before
#: the raylet's plasma client may connect, which it tries 10 times a second apart
#: before aborting (and ``ray.init`` waits 30 s for the node): on a fresh machine, with
#: the checkpoints just written still in the page cache, a 6.27 GB store took longer,
#: and the bench's first run died at start. The store's pages are first touched by
#: the untimed warm-up instead (``Ends.warm_store``).
PLASMA_CONFIG = {"preallocate_plasma_memory": False}
#: The smallest object store a run starts with, first or on its retry.
MIN_STORE_BYTES = 256 * MiB
#: The nodes of ``--cross-node`` by their custom resource: the head (the driver's
#: node: the producer's, and the storage node of ``--train``) and one other.
CROSS_NODES = ("node_a", "node_b")


@contextlib.contextmanager
def ray_session(
    cross_node: bool,
    num_cpus: int,
    store_bytes: int,
    nodes: Sequence[str] = CROSS_NODES,
    log_to_driver: bool = False,
    retry_store_bytes: int | None = None,
    system_config: dict[str, Any] | None = None,
    node_resources: Mapping[str, Mapping[str, float]] | None = None,
) -> Iterator[str]:
    """An embedded Ray for the run: one local node, or with ``cross_node`` a
    ``ray.cluster_utils.Cluster`` on this machine with one node per name in
    ``nodes`` (each holding that custom resource; the first is the head, where the
    driver runs), each node with its own object store of ``store_bytes``. An
    already initialized Ray (single node only) is reused and left running. The
    workers' output reaches the driver only with ``log_to_driver`` (``--progress``:
    their bars travel in it). ``system_config``: Ray system settings of the cluster
    (with ``cross_node``), beside ``PLASMA_CONFIG``. ``node_resources``: more custom
    resources of a node, by its name (one several nodes share, to place one Train
    worker on each of them).

    Should Ray fail to start, what the failed start left running is stopped and Ray
    is started once more with a smaller store (``retry_store_bytes``, by default
    ``retry_store_size``), saying so on stderr and in the description yielded; a
    second failure is raised."""
    if ray.is_initialized():
        if cross_node:
            raise RuntimeError("--cross-node starts its own 2-node cluster: call ray.shutdown()")
        yield "reused the running Ray"
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    how = f"{len(nodes)}-node cluster" if cross_node else "local Ray"
    retry = retry_store_bytes or retry_store_size(store_bytes)
    try:
        cluster = _start_ray(
            cross_node, num_cpus, store_bytes, nodes, log_to_driver, system_config, node_resources
        )
    except Exception as e:
        if retry is None:
            raise
        print(
            f"Ray did not start with a {store_bytes / GB:.2f} GB object store per node "
            f"({type(e).__name__}: {e}); starting it once more with {retry / GB:.2f} GB",
            file=sys.stderr,
            flush=True,
        )
        cluster = _start_ray(
            cross_node, num_cpus, retry, nodes, log_to_driver, system_config, node_resources
        )
        how += f", started again with a {retry / GB:.2f} GB store after a failed start"
    try:
        yield how
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def retry_store_size(store_bytes: int) -> int | None:
    """The object store per node to retry a failed start with: half the first one,
    not under ``MIN_STORE_BYTES``; None if the first one was that small already."""
    smaller = max(MIN_STORE_BYTES, store_bytes // 2)
    return smaller if smaller < store_bytes else None


def _start_ray(
    cross_node: bool,
    num_cpus: int,
    store_bytes: int,
    nodes: Sequence[str],
    log_to_driver: bool,
    system_config: dict[str, Any] | None = None,
    node_resources: Mapping[str, Mapping[str, float]] | None = None,
) -> Any:
    """Start Ray (see ``ray_session``) and connect to it; returns the cluster, if any.
    A start that fails leaves nothing running."""
    started = _children()
    try:
        return _start_and_connect(
            cross_node, num_cpus, store_bytes, nodes, log_to_driver, system_config, node_resources
        )
    except BaseException:
        _stop_failed_start(started)
        raise


def _start_and_connect(
    cross_node: bool,
    num_cpus: int,
    store_bytes: int,
    nodes: Sequence[str],
    log_to_driver: bool,
    system_config: dict[str, Any] | None = None,
    node_resources: Mapping[str, Mapping[str, float]] | None = None,
) -> Any:
    quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": log_to_driver}
    if not cross_node:
        # "local": always a fresh instance, never a cluster someone started with `ray start`.
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            object_store_memory=store_bytes,
            _system_config=PLASMA_CONFIG,
            **quiet,
        )
        return None
    from ray.cluster_utils import Cluster

    node: dict[str, Any] = {"num_cpus": num_cpus, "object_store_memory": store_bytes}
    extra = node_resources or {}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **node,
            "resources": {nodes[0]: 1, **extra.get(nodes[0], {})},
            "include_dashboard": False,
            "_system_config": {**PLASMA_CONFIG, **(system_config or {})},
        },
    )
    try:
        for name in nodes[1:]:
            cluster.add_node(**node, resources={name: 1, **extra.get(name, {})})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, **quiet)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _stop_failed_start(before: set[int]) -> None:
    """Disconnect, and end the processes a failed start left running: Ray's own
    clean-up never runs when ``ray.init`` fails half way (its GCS server, for one,
    stays up). They are this process's children that were not there before."""
    ray.shutdown()
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=10)


def auto_store_bytes(
    largest_bytes: int, cross_node: bool, nodes: int = 2, total: int | None = None
) -> int:
    """Object store per node: room for the largest checkpoint 1.5 times over, at most
    half of memory (60% over the ``nodes`` nodes across nodes: 30% each for two) and
    never under 256 MiB. A chunked trip holds every chunk until it is dropped, and
    Ray spills once a store is 80% full: a store of 30% of memory (Ray's default) made
    an 8 GB trip on a 24 GiB machine spill, 2.8x ``cp-direct`` against 1.1x with
    room (docs/performance.md)."""
    total = total or psutil.virtual_memory().total
    cap = int(total * (0.6 / nodes if cross_node else 0.5))
    return max(MIN_STORE_BYTES, min(int(1.5 * largest_bytes) + 256 * MiB, cap))


def store_capacity() -> int | None:
    return int(ray.cluster_resources().get("object_store_memory", 0)) or None


def prefault_memory(margin_bytes: int) -> None:
    """Touch all available memory but ``margin_bytes`` once, in a child process that
    then exits, so that no measurement pays a VM's first-touch cost (see --no-prefault).
    It also evicts the page cache; the checkpoints are read (digested) afterwards.

    The kernel zeroes every page of one populated mapping (``MAP_POPULATE``): one pass
    over memory, 4 GiB in ~2 s here, where writing it from Python took ~9.5 s (a second
    buffer as large, touched too)."""
    nbytes = max(0, psutil.virtual_memory().available - margin_bytes)
    code = (
        "import mmap, sys\n"
        "n = int(sys.argv[1])\n"
        "if n and hasattr(mmap, 'MAP_POPULATE'):\n"
        "    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE\n"
        "    mmap.mmap(-1, n, flags=flags)\n"
        "elif n:\n"
        "    m, page = mmap.mmap(-1, n), mmap.PAGESIZE\n"
        "    for off in range(0, n, page):\n"
        "        m[off] = 1\n"
    )
    subprocess.run([sys.executable, "-c", code, str(nbytes)], check=True)


def drop_caches() -> bool:
    """Flush dirty pages and drop the page cache (needs root); False if not allowed."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def machine_info(data_dir: str) -> dict[str, Any]:
    """Where the numbers were measured."""
    mem = psutil.virtual_memory()
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "air_transfer": air_transfer.__version__,
        "cpus": os.cpu_count(),
        "memory_total_gib": round(mem.total / GiB, 2),
        "memory_available_gib": round(mem.available / GiB, 2),
        "data_dir_free_gib": round(shutil.disk_usage(data_dir).free / GiB, 2),
    }
