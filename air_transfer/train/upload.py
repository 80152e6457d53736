"""Checkpoints into a run's storage: ``checkpoint_upload_fn`` (the per-report plug
point of ``ray.train.report``), ``upload_checkpoint`` (its work) and Ray Train's
report hook into node storage (``hooks.upload_directory``) all plan the upload
(``plan.plan_upload``) and hand the plan to ``store``, which carries it out: the
one place where a checkpoint is packed (``_pack_and_store``) and stored.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from contextlib import nullcontext

import pyarrow.fs as pafs
import ray
from ray.train import Checkpoint

from air_transfer.checkpoint import ChunkedCheckpoint
from air_transfer.cluster.nodes import head_node_id, resolve_node, this_node_id
from air_transfer.config import TransferConfig
from air_transfer.errors import SourceChangedError
from air_transfer.storage.client import replica_train
from air_transfer.storage.client.handler import NodeStorageHandler, node_storage_handler
from air_transfer.storage.client.incremental import store_incremental
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.node_api import NodeCheckpoints
from air_transfer.train.plan import NodeStorage, Route, UploadPlan, local_directory, plan_upload

#: ``fs``'s node storage handler as the routes below get it (None: another filesystem).
Handler = NodeStorageHandler | None


def checkpoint_upload_fn(
    checkpoint: Checkpoint,
    checkpoint_dir_name: str,
    *,
    node: str | None = None,
    config: TransferConfig | None = None,
) -> Checkpoint:
    """Upload a reported checkpoint in chunks: packed by this node's agent while the
    agent of ``node`` already writes the chunks packed so far into the run's storage
    (``RunConfig`` storage, any pyarrow filesystem that node can reach); returns once
    it is stored. Pass it to ``ray.train.report``; set ``node`` or ``config`` with
    ``functools.partial``. Into a ``storage_filesystem(replicas=K)`` the checkpoint
    is stored on every live copy, as a report is; on a local filesystem it appears
    whole and verified.

    Args:
        checkpoint: the reported checkpoint (a local directory).
        checkpoint_dir_name: the directory name Ray Train chose for it.
        node: the node whose agent writes it (a node id, IP address or ``"head"``;
            default: the storage's node for a ``storage_filesystem()``, else the
            head node).
        config: the transfer's chunk size and window.

    Returns:
        The checkpoint as stored in the run's storage.
    """
    if node is not None:
        node = resolve_node(node)
    storage = ray.train.get_context().get_storage()
    dest = storage.build_checkpoint_path_from_name(checkpoint_dir_name)
    return upload_checkpoint(storage.storage_filesystem, dest, checkpoint, node, config)


def upload_checkpoint(
    fs: pafs.FileSystem,
    dest: str,
    checkpoint: Checkpoint,
    node: str | None = None,
    config: TransferConfig | None = None,
) -> Checkpoint:
    """``checkpoint_upload_fn``'s work: ``checkpoint`` stored at ``dest`` of ``fs``.

    Into node storage (``node`` unset or the storage node), a local directory is
    stored by node storage's own routes (``plan.Route``): into replicated storage,
    packed once and written by every copy's agent, failing over when the storage
    node is gone; anything else is written through ``fs`` by an agent, ``node``'s
    or this node's (``fs`` keeps every copy) or the storage node's.
    """
    plan = planned(fs, dest, checkpoint, node, config, None)
    stored = store(plan, fs, checkpoint)
    assert stored is not None  # only a report hook's plan declines
    return stored


def planned(
    fs: pafs.FileSystem,
    dest: str,
    checkpoint: Checkpoint,
    node: str | None,
    config: TransferConfig | None,
    worker: str | None,
) -> UploadPlan:
    """``plan_upload`` for ``checkpoint`` into ``fs``, from where it and this process
    are."""
    handler = node_storage_handler(fs)
    storage = None
    if handler is not None:
        replicated = isinstance(handler, ReplicatedHandler)
        placed = isinstance(handler, WriterPlacedHandler)
        storage = NodeStorage(handler.node_id, replicated, handler.config, placed)
    source = local_directory(checkpoint) if storage is not None else None
    here = this_node_id() if ray.is_initialized() else None
    return plan_upload(
        dest, config, storage=storage, source=source, node=node, here=here, worker=worker
    )


def store(plan: UploadPlan, fs: pafs.FileSystem, checkpoint: Checkpoint) -> Checkpoint | None:
    """Carry out ``plan`` for ``checkpoint`` (its local directory ``plan.source``)
    into ``fs``: the checkpoint as stored, once it is; None for ``Route.RAY`` (Ray
    Train copies it). Into node storage with a durable tier and ``max_lag_bytes``,
    it first waits while the bytes not yet in that tier, with its own, would pass
    the limit, and holds their room until it is stored."""
    if plan.route is Route.RAY:
        return None
    handler = node_storage_handler(fs)
    room = nullcontext() if handler is None else handler.admitted(directory_bytes(plan.source))
    with room:
        _ROUTES[plan.route](plan, fs, checkpoint, handler)
    return Checkpoint(plan.dest, filesystem=fs)


def directory_bytes(source: str | None) -> int:
    """The bytes of the regular files under the local directory ``source`` (0 for
    None): what storing it adds to node storage."""
    if source is None:
        return 0
    total = 0
    for top, _, names in os.walk(source):
        for name in names:
            st = os.lstat(os.path.join(top, name))
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def _replicas(
    plan: UploadPlan, fs: pafs.FileSystem, checkpoint: Checkpoint, handler: Handler
) -> None:
    assert isinstance(handler, ReplicatedHandler)
    worker = plan.worker
    if worker is None:  # checkpoint_upload_fn's: noted under the reporting worker
        worker = ray.get_runtime_context().get_actor_id() or ""
    _pack_and_store(
        checkpoint,
        plan.config,
        lambda ref: replica_train.store_report(handler, plan.dest, ref, worker, plan.config),
    )


def _incremental(
    plan: UploadPlan, fs: pafs.FileSystem, checkpoint: Checkpoint, handler: Handler
) -> None:
    assert isinstance(handler, NodeStorageHandler) and plan.source is not None
    link = handler.link
    if plan.config != link.config:
        link = AgentLink(handler.node_id, handler.root, plan.config)
    if store_incremental(link, plan.source, plan.dest, plan.worker) is None:
        raise SourceChangedError(
            errno.EAGAIN,
            "the checkpoint directory gained a symlink while it was stored; nothing was "
            "stored: report again",
            plan.source,
        )


def _from_disk(
    plan: UploadPlan, fs: pafs.FileSystem, checkpoint: Checkpoint, handler: Handler
) -> None:
    assert isinstance(handler, NodeStorageHandler) and plan.worker is not None
    handler.link.call(
        NodeCheckpoints.store_report, plan.worker, plan.source, handler.root, plan.dest,
        plan.config,
    )  # fmt: skip


def _packed(
    plan: UploadPlan, fs: pafs.FileSystem, checkpoint: Checkpoint, handler: Handler
) -> None:
    assert isinstance(handler, NodeStorageHandler) and plan.worker is not None
    worker, root = plan.worker, handler.root
    _pack_and_store(
        checkpoint,
        plan.config,
        lambda ref: handler.link.call(
            NodeCheckpoints.store_report, worker, ref, root, plan.dest, plan.config
        ),
    )


def _through_fs(
    plan: UploadPlan, fs: pafs.FileSystem, checkpoint: Checkpoint, handler: Handler
) -> None:
    link = AgentLink(plan.node or head_node_id(), "/", plan.config)  # its errors as ours
    _pack_and_store(
        checkpoint,
        plan.config,
        lambda ref: link.call(NodeCheckpoints.store_checkpoint, ref, fs, plan.dest),
    )


#: How each route is carried out: ``(plan, fs, checkpoint, handler)``.
_ROUTES: dict[Route, Callable[[UploadPlan, pafs.FileSystem, Checkpoint, Handler], None]] = {
    Route.REPLICAS: _replicas,
    Route.INCREMENTAL: _incremental,
    Route.FROM_DISK: _from_disk,
    Route.PACKED: _packed,
    Route.THROUGH_FS: _through_fs,
}


def _pack_and_store(
    checkpoint: Checkpoint,
    config: TransferConfig,
    store: Callable[[ray.ObjectRef[ChunkedCheckpoint]], object],
) -> None:
    """Pack ``checkpoint`` (here, by this node's agent) while agents store what is
    packed so far (``store(ref)``, which returns once it is stored); returns then."""
    future = ChunkedCheckpoint.from_checkpoint(checkpoint).to_object_ref_async(config)
    # A top-level ref argument reaches the agent as the transferred checkpoint itself.
    store(future.ref)
    future.result()  # stored means packed, but any packing error is raised as such
