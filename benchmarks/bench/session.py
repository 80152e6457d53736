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
from collections.abc import Iterator, Sequence
from typing import Any

import psutil
import ray

import air_transfer
from benchmarks.units import GiB, MiB

#: Raylets fault their whole object store in at start (a production setting), so the
#: first contender to fill it does not pay the store's first-touch cost for the rest.
PLASMA_CONFIG = {"preallocate_plasma_memory": True}
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
) -> Iterator[str]:
    """An embedded Ray for the run: one local node, or with ``cross_node`` a
    ``ray.cluster_utils.Cluster`` on this machine with one node per name in
    ``nodes`` (each holding that custom resource; the first is the head, where the
    driver runs), each node with its own object store of ``store_bytes``. An
    already initialized Ray (single node only) is reused and left running. The
    workers' output reaches the driver only with ``log_to_driver`` (``--progress``:
    their bars travel in it)."""
    if ray.is_initialized():
        if cross_node:
            raise RuntimeError("--cross-node starts its own 2-node cluster: call ray.shutdown()")
        yield "reused the running Ray"
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": log_to_driver}
    cluster = None
    if cross_node:
        from ray.cluster_utils import Cluster

        node: dict[str, Any] = {"num_cpus": num_cpus, "object_store_memory": store_bytes}
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                **node,
                "resources": {nodes[0]: 1},
                "include_dashboard": False,
                "_system_config": PLASMA_CONFIG,
            },
        )
        for name in nodes[1:]:
            cluster.add_node(**node, resources={name: 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, **quiet)
    else:
        # "local": always a fresh instance, never a cluster someone started with `ray start`.
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            object_store_memory=store_bytes,
            _system_config=PLASMA_CONFIG,
            **quiet,
        )
    try:
        yield f"{len(nodes)}-node cluster" if cross_node else "local Ray"
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def auto_store_bytes(largest_bytes: int, cross_node: bool, nodes: int = 2) -> int:
    """Object store per node: room for the largest checkpoint 1.5 times over, at most
    30% of memory (40% over the ``nodes`` nodes across nodes: 20% each for two) and
    never under 256 MiB."""
    total = psutil.virtual_memory().total
    cap = int(total * (0.4 / nodes if cross_node else 0.3))
    return max(256 * MiB, min(int(1.5 * largest_bytes) + 256 * MiB, cap))


def store_capacity() -> int | None:
    return int(ray.cluster_resources().get("object_store_memory", 0)) or None


def prefault_memory(margin_bytes: int) -> None:
    """Touch all available memory but ``margin_bytes`` once, in a child process that
    then exits, so that no measurement pays a VM's first-touch cost (see --no-prefault).
    It also evicts the page cache; the checkpoints are read (digested) afterwards."""
    nbytes = max(0, psutil.virtual_memory().available - margin_bytes)
    code = (
        "import mmap, sys\n"
        "n = int(sys.argv[1]); m = mmap.mmap(-1, n)\n"
        "for off in range(0, n, 1 << 30):\n"
        "    m[off:off + min(1 << 30, n - off)] = b'\\1' * min(1 << 30, n - off)\n"
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
