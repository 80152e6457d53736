"""What the replica tests share: a replicated node storage whose copies each live
in a directory of their own (the mock cluster's nodes share one disk), the
registry's view of it, the copies compared on disk, and nodes removed and added."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path

import psutil
import pyarrow.fs as pafs
import ray
from ray.cluster_utils import Cluster

from air_transfer import TransferConfig, storage_filesystem
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.replica_set import registry
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.storage.server.replica_marker import is_marker
from tests.support.cluster import STORE_BYTES, node_ids
from tests.support.node_storage import CONFIG, read
from tests.support.waiting import eventually

_names = itertools.count()


def replicated(
    tmp: Path, k: int, node: str, named: tuple[str, ...] = (), config: TransferConfig = CONFIG
) -> tuple[pafs.FileSystem, ReplicatedHandler]:
    """Node storage on the node with resource ``node`` plus K-1 copies (those named
    first), copy n rooted at ``tmp/copies/<n's id>``."""
    ids = node_ids()
    primary = ids[node]
    fs = storage_filesystem(
        node=primary,
        config=config,
        root=str(tmp / "copies" / primary),
        replicas=k,
        replica_nodes=tuple(ids[n] for n in named),
        replica_root=str(tmp / "copies" / "{node_id}"),
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, ReplicatedHandler)
    return fs, handler


def view(h: ReplicatedHandler) -> tuple[dict[str, str], list[str], list[str]]:
    """``(node -> root of every member copy, fresh nodes, syncing nodes)``."""
    copies, fresh, syncing, _ = ray.get(registry().view.remote(h.key))
    return dict(copies), fresh, syncing


def fresh_roots(h: ReplicatedHandler) -> dict[str, str]:
    copies, fresh, _ = view(h)
    return {n: copies[n] for n in fresh}


def tree(root: str) -> dict[str, bytes | None]:
    """Relative path -> bytes (None for a directory) of what is under ``root``,
    staging files included (none may be left), the copy's marker left out (it names
    its own node)."""
    out: dict[str, bytes | None] = {}
    for base, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(base, d), root)] = None
        for f in files:
            if base == root and is_marker(f):
                continue
            with open(os.path.join(base, f), "rb") as fh:
                out[os.path.relpath(os.path.join(base, f), root)] = fh.read()
    return out


def copies_identical(h: ReplicatedHandler, k: int) -> dict[str, bytes | None]:
    """Wait until K fresh copies on K distinct live nodes hold the same tree; it."""

    def same() -> dict[str, bytes | None] | None:
        roots = fresh_roots(h)
        live = set(node_ids().values())
        if len(roots) != k or not set(roots) <= live:
            return None
        trees = [tree(r) for r in roots.values()]
        return trees[0] if all(t == trees[0] for t in trees) else None

    return eventually(same, lambda: f"{k} identical fresh copies: {view(h)}", timeout_s=60)


@ray.remote(num_cpus=0)
def read_local(fs: pafs.FileSystem, path: str) -> bytes | None:
    """What a reader on this node reads at ``path`` (None: absent)."""
    try:
        return read(fs, path)
    except FileNotFoundError:
        return None


def remove(cluster: Cluster, node_id: str) -> None:
    """Remove the node ``node_id`` for good, as a machine is lost: every process of it
    gone (``remove_node`` kills the raylet, but its workers, the node's agent among
    them, live on until they notice, and on a mock cluster still reach the shared
    disk), and wait until Ray knows it is dead."""
    doomed = next(n for n in cluster.worker_nodes if n.node_id == node_id)
    raylet = doomed.all_processes["raylet"][0].process
    workers = psutil.Process(raylet.pid).children(recursive=True)
    cluster.remove_node(doomed, allow_graceful=False)
    for worker in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            worker.kill()
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, f"processes of node {node_id} still alive: {alive}"
    eventually(lambda: node_id not in node_ids().values(), f"node {node_id} declared dead")


def top_up(cluster: Cluster, count: int) -> None:
    """Add worker nodes until ``count`` nodes are alive (the head included)."""
    while len(node_ids()) < count:
        name = f"node_r{next(_names)}"
        cluster.add_node(num_cpus=1, resources={name: 1.0}, object_store_memory=STORE_BYTES)
        cluster.wait_for_nodes()
        eventually(lambda n=name: n in node_ids(), f"node {name} alive")


def workers() -> list[str]:
    """Resource names of the live worker nodes, in order."""
    return sorted(n for n in node_ids() if n != "head")
