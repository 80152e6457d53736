"""``storage_filesystem()``: the entrance of node storage, where its settings are
checked once (``settings``) and its handler made, with Ray Train's hooks as its
``setup`` (``hooks.install``): in every process that makes or receives it."""

from __future__ import annotations

import pyarrow.fs as pafs
import ray

from air_transfer.cluster.nodes import NODE_FORMS
from air_transfer.config import Durable, StorageConfig, TransferConfig
from air_transfer.core.keywords import positional_at_most
from air_transfer.storage.client.handler import NodeStorageHandler
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.train.hooks import install
from air_transfer.train.settings import StorageSettings, storage_settings


@positional_at_most(
    0,
    "storage_filesystem() takes keyword arguments only: storage_filesystem(node=..., "
    "config=..., root=...), node being " + NODE_FORMS + "; the storage path goes in "
    "RunConfig(storage_path=...)",
)
def storage_filesystem(
    *,
    node: str | None = None,
    config: TransferConfig | None = None,
    root: str = "/",
    replicas: int = 1,
    replica_nodes: tuple[str, ...] = (),
    replica_root: str | None = None,
    durable: Durable | None = None,
    storage: StorageConfig | None = None,
) -> pafs.PyFileSystem:
    """A ``pyarrow`` filesystem whose files live on the disk of one node and that
    every node of the cluster can use: give it to ``RunConfig(storage_filesystem=)``.

    ``node``: a Ray node id, a node's IP address, or ``"head"`` (default: the node of
    the process that makes it, the driver's; made before ``ray.init``, the node of
    the process that first uses it). An IP or ``"head"`` is resolved to its node id
    at once when Ray is running, else at first use; a node that is not live, an IP
    that no live node or several have, or any other text raises ValueError.

    Paths are that node's absolute paths; ``root`` confines them (a path leaving it
    is refused). ``config`` sets the chunk size and window of the transfers.

    ``replicas=K`` keeps every file on K distinct nodes (``node``, the
    ``replica_nodes`` named, in the same forms, then others picked), under the same
    root on each or ``replica_root.format(node_id=...)``; reads and writes fail over
    to a live copy.

    ``durable``: a durable tier beyond the cluster (a URI ``pyarrow.fs.FileSystem
    .from_uri`` accepts, or a ``(filesystem, path)`` pair) that the storage node's
    agent feeds in the background, and that reads fall through to where node storage
    does not hold a path (a new cluster resuming a run). ``storage``: all of these
    settings in one ``StorageConfig`` (with its durable tier's limits), instead of
    the keywords.
    """
    keywords = StorageConfig(
        replicas=replicas,
        replica_nodes=tuple(replica_nodes),
        replica_root=replica_root,
        durable=durable,
    )
    return pafs.PyFileSystem(_handler(storage_settings(node, config, root, keywords, storage)))


def _handler(chosen: StorageSettings) -> NodeStorageHandler:
    """The handler of node storage ``chosen``: on K nodes if it keeps copies (placed,
    and checked, now where Ray runs)."""
    node, root, config, durable, drain = (
        chosen.node, chosen.root, chosen.config, chosen.durable, chosen.drain,
    )  # fmt: skip
    if not chosen.replicated:
        return NodeStorageHandler(node, root, config, durable, drain, install)
    storage = chosen.storage
    handler = ReplicatedHandler(
        node, root, config, storage.replicas, storage.replica_nodes, storage.replica_root,
        durable, drain, install,
    )  # fmt: skip
    if ray.is_initialized():
        handler.settle()  # the copies are placed (and checked) now, by the maker
    return handler
