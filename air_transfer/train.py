"""The Trainer config option: Ray Train on several nodes with no shared storage.

Since Ray 2.7 every node must reach ``RunConfig(storage_path)`` (ray-project/ray#37177,
#46913). ``storage_filesystem()`` gives Train one: the files live on one node's disk
and every worker reaches them through that node's agent, in chunks::

    RunConfig(storage_path="/abs/dir", storage_filesystem=air_transfer.storage_filesystem())

``checkpoint_upload_fn`` is the per-report plug point instead, for a run that keeps
its own storage: ``ray.train.report(..., checkpoint_upload_fn=checkpoint_upload_fn)``.
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs
import ray
from ray.train import Checkpoint

from air_transfer.agent import node_agent
from air_transfer.checkpoint import ChunkedCheckpoint
from air_transfer.config import TransferConfig
from air_transfer.fs import payload_filesystem
from air_transfer.handle import TransferHandle
from air_transfer.local_storage import checked_path
from air_transfer.node_storage import NodeStorageHandler, node_storage_handler


def storage_filesystem(
    node: str | None = None, config: TransferConfig | None = None, *, root: str = "/"
) -> pafs.PyFileSystem:
    """A ``pyarrow`` filesystem whose files live on the disk of ``node`` (a Ray node
    id; default: the driver's node) and that every node of the cluster can use.

    Paths are that node's absolute paths; ``root`` confines them (a path leaving it
    is refused). ``config`` sets the chunk size and window of the transfers. Made
    before ``ray.init``, the default node is that of the process that first uses it.
    """
    if config is not None and not isinstance(config, TransferConfig):
        raise TypeError(f"config must be a TransferConfig, got {type(config).__name__}")
    if node is None and ray.is_initialized():
        node = ray.get_runtime_context().get_node_id()
    if node is not None and ray.is_initialized():
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        if node not in alive:
            raise ValueError(
                f"node {node!r} is not a live node of this Ray cluster; pass a node id "
                "from ray.nodes() (or None for the driver's node)"
            )
    return pafs.PyFileSystem(NodeStorageHandler(node, root, config))


def checkpoint_upload_fn(
    checkpoint: Checkpoint,
    checkpoint_dir_name: str,
    *,
    node: str | None = None,
    config: TransferConfig | None = None,
) -> Checkpoint:
    """Upload a reported checkpoint in chunks: pack it here, and have the agent of
    ``node`` write it into the run's storage (``RunConfig`` storage, any pyarrow
    filesystem that node can reach). Pass it to ``ray.train.report``; set ``node`` or
    ``config`` with ``functools.partial``.

    ``node`` defaults to the storage's node for a ``storage_filesystem()``, else the
    head node. On a local filesystem the checkpoint appears whole and verified.
    """
    storage = ray.train.get_context().get_storage()
    fs = storage.storage_filesystem
    dest = storage.build_checkpoint_path_from_name(checkpoint_dir_name)
    handler = node_storage_handler(fs)
    target = node or (handler.node_id if handler is not None else head_node_id())
    handle = ChunkedCheckpoint.from_checkpoint(checkpoint).pack(config)
    ray.get(node_agent(target).store_checkpoint.remote(handle, fs, dest))
    return Checkpoint(dest, filesystem=fs)


def store_checkpoint(handle: TransferHandle, filesystem: pafs.FileSystem, path: str) -> str:
    """Write ``handle``'s checkpoint to ``path`` on ``filesystem`` from this process:
    through the atomic, verified writer when the path is on this node's disk, else
    file by file through pyarrow."""
    here = ray.get_runtime_context().get_node_id()
    handler = node_storage_handler(filesystem)
    if handler is not None and handler.node_id == here:
        return handle.write_to(checked_path(handler.root, path))
    if isinstance(filesystem, pafs.LocalFileSystem):
        return handle.write_to(os.path.abspath(path))
    filesystem.create_dir(path, recursive=True)
    pafs.copy_files(
        "/", path, source_filesystem=payload_filesystem(handle), destination_filesystem=filesystem
    )
    return path


def head_node_id() -> str:
    """The id of the cluster's head node."""
    for n in ray.nodes():
        if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {}):
            return n["NodeID"]
    raise RuntimeError("no live head node in this Ray cluster; pass node= explicitly")
