"""``storage_filesystem()``: the entrance of node storage, where its settings are
checked once (``settings``) and its handler made, with Ray Train's hooks as its
``setup`` (``hooks.install``): in every process that makes or receives it. What
needs the cluster (the root on the storage node, the copies' nodes) the maker checks
as soon as Ray runs: at once, or as it first ships the filesystem (``Trainer.fit()``
does, before it starts Train's controller), so that a bad setting is raised by the
user's own call, as itself.
"""

from __future__ import annotations

import errno
import functools
import os
import posixpath

import pyarrow.fs as pafs
import ray

from air_transfer.cluster.nodes import NODE_FORMS
from air_transfer.config import Durable, StorageConfig, TransferConfig
from air_transfer.core.keywords import positional_at_most
from air_transfer.storage.client.handler import NodeStorageHandler
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.node_api import NodeFiles
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
    root: str | None = None,
    replicas: int = 1,
    replica_nodes: tuple[str, ...] = (),
    replica_root: str | None = None,
    durable: Durable | None = None,
    storage: StorageConfig | None = None,
    expose_system_dirs: bool = False,
) -> pafs.PyFileSystem:
    """A ``pyarrow`` filesystem whose files live on the disk of one node and that
    every node of the cluster can use: give it to ``RunConfig(storage_filesystem=)``.

    ``node``: a Ray node id, a node's IP address, or ``"head"`` (default: the node of
    the process that makes it, the driver's; made before ``ray.init``, the node of
    the process that first uses it). An IP or ``"head"`` is resolved to its node id
    at once when Ray is running, else at first use; a node that is not live, an IP
    that no live node or several have, or any other text raises ValueError.

    Paths are that node's absolute paths; ``root`` confines them (a path leaving it
    is refused): default ``~/air_transfer`` of the process that makes it. A root
    that is ``/``, a system directory (``/etc``, ``/usr``...) or holds one, or a
    directory shared by all (``/home``, ``/tmp``...) is refused (ValueError) unless
    ``expose_system_dirs=True``; one that is a file on that node, NotADirectoryError
    (a missing one is made by the first write). ``config`` sets the chunk size and
    window of the transfers.

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

    What needs Ray (the root on that node, ``replicas`` against the live nodes) is
    checked where Ray runs; made before ``ray.init``, as this process first ships the
    filesystem (``Trainer.fit()`` does, before Train's controller starts).
    ``air_transfer.run_config()`` makes a Ray Train ``RunConfig`` around one.
    """
    keywords = StorageConfig(
        replicas=replicas,
        replica_nodes=tuple(replica_nodes),
        replica_root=replica_root,
        durable=durable,
    )
    chosen = storage_settings(node, config, root, keywords, storage, expose_system_dirs)
    handler = _handler(chosen)
    if ray.is_initialized():
        _settle(handler)
    else:
        handler.checks_when_shipped = functools.partial(_settle, handler)
    return pafs.PyFileSystem(handler)


def _handler(chosen: StorageSettings) -> NodeStorageHandler:
    """The handler of node storage ``chosen``: on K nodes if it keeps copies."""
    node, root, config, durable, drain = (
        chosen.node, chosen.root, chosen.config, chosen.durable, chosen.drain,
    )  # fmt: skip
    if not chosen.replicated:
        return NodeStorageHandler(node, root, config, durable, drain, install)
    storage = chosen.storage
    return ReplicatedHandler(
        node, root, config, storage.replicas, storage.replica_nodes, storage.replica_root,
        durable, drain, install,
    )  # fmt: skip


def _settle(handler: NodeStorageHandler) -> None:
    """The maker's checks, Ray running: the root on the storage node; a replicated
    storage's copies placed (and checked) by the maker."""
    _check_root(handler)
    if isinstance(handler, ReplicatedHandler):
        handler.settle()


def _check_root(handler: NodeStorageHandler) -> None:
    """NotADirectoryError if the storage node has a file at the root or on its way
    there (a missing root is made by the first write into it)."""
    root, way = handler.root, [handler.root]
    while way[-1] != "/":
        way.append(posixpath.dirname(way[-1]))
    # Asked of "/": the storage's own calls see nothing above its root.
    link = AgentLink(handler.node_id, "/", handler.config)
    infos = link.call(NodeFiles.fs_info, "/", way)
    for path, (kind, _, _) in zip(way, infos, strict=True):
        if kind == pafs.FileType.File:
            raise NotADirectoryError(
                errno.ENOTDIR,
                f"{os.strerror(errno.ENOTDIR)}: the storage root {root!r} on node "
                f"{handler.node_id[:12]} is not a directory ({path!r} is a file); pass "
                "root= a directory, or a path where one can be made",
                path,
            )
