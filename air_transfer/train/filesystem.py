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
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.node_api import NodeMetadata
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
    placement: str = "storage",
    durable: Durable | None = None,
    storage: StorageConfig | None = None,
    expose_system_dirs: bool = False,
) -> pafs.PyFileSystem:
    """A ``pyarrow`` filesystem whose files live on the disk of one node and that
    every node of the cluster can use: give it to ``RunConfig(storage_filesystem=)``
    (or let ``air_transfer.run_config()`` make the ``RunConfig`` around one).

    Paths are that node's absolute paths, confined to ``root``. What needs Ray (the
    root on that node, ``replicas`` against the live nodes) is checked where Ray
    runs; made before ``ray.init``, as this process first ships the filesystem
    (``Trainer.fit()`` does, before Train's controller starts).

    Args:
        node: the storage node: a Ray node id, a node's IP address, or ``"head"``
            (default: the node of the process that makes it, the driver's; made
            before ``ray.init``, the node of the process that first uses it).
        config: the transfers' chunk size and window (``TransferConfig``).
        root: the directory the files live under (default ``~/air_transfer`` of
            the process that makes it); a path leaving it is refused.
        replicas: keep every file on this many distinct nodes; reads and writes
            fail over to a live copy.
        replica_nodes: nodes to hold the copies first, in ``node``'s forms.
        replica_root: each copy's root, ``{node_id}`` formatted in (default: ``root``).
        placement: ``"storage"`` (the default: every file's bytes on the storage node
            and its copies) or ``"writer"``: a file's bytes stay on the node of the
            process that wrote it and go to ``replicas - 1`` other nodes (each under
            ``replica_root`` formatted with ``"<node id>.placed"``), published only
            once every holder has them; the storage node and its copies keep the
            names, directories, files under 1 MiB and, for each larger file, a sparse
            stub of its size that records its holders. Reads go to the reader's own
            node first, then fail over between holders. Needs ``replicas >= 2`` and a
            ``replica_root`` with ``{node_id}``; refused with ``durable`` (not built
            yet). Appends to a file are refused.
        durable: a durable tier beyond the cluster (a URI
            ``pyarrow.fs.FileSystem.from_uri`` accepts, or a ``(filesystem, path)``
            pair), fed in the background, that reads fall through to where node
            storage does not hold a path (a new cluster resuming a run).
        storage: all of the storage settings in one ``StorageConfig`` (with the
            durable tier's limits), instead of the keywords.
        expose_system_dirs: allow a root that is ``/``, a system directory or a
            directory shared by all (``/home``, ``/tmp``...).

    Returns:
        A ``pyarrow.fs.PyFileSystem`` over node storage.

    Raises:
        ValueError: a node that is not live, an IP no live node or several have, a
            root that exposes system directories, more replicas than live nodes,
            settings given both as keywords and in ``storage``.
        NotADirectoryError: the root is a file on the storage node.
    """
    keywords = StorageConfig(
        replicas=replicas,
        replica_nodes=tuple(replica_nodes),
        replica_root=replica_root,
        placement=placement,
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
    args = (
        node, root, config, storage.replicas, storage.replica_nodes, storage.replica_root,
        durable, drain, install,
    )  # fmt: skip
    if storage.placement == "writer":
        return WriterPlacedHandler(*args, failure_domain=storage.failure_domain)
    return ReplicatedHandler(*args)


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
    infos = link.call(NodeMetadata.fs_info, "/", way)
    for path, (kind, _, _) in zip(way, infos, strict=True):
        if kind == pafs.FileType.File:
            raise NotADirectoryError(
                errno.ENOTDIR,
                f"{os.strerror(errno.ENOTDIR)}: the storage root {root!r} on node "
                f"{handler.node_id[:12]} is not a directory ({path!r} is a file); pass "
                "root= a directory, or a path where one can be made",
                path,
            )
