"""Ray Train's checkpoint copies into and out of node storage, and its stopped rounds.

Every process that makes or receives a ``storage_filesystem()`` (the driver, each
Train worker, the controller) runs ``install`` once (the handler's ``setup``): Ray
Train's uploads and restores then go through ``upload_directory`` and
``download_directory`` (``_ray_hooks.install_train_hooks``) rather than pyarrow's
file-by-file copy: one chunked transfer, pipelined, written by the verified
``O_DIRECT`` writer and published whole; a ``SYNC`` report returns once its round
is committed (``rounds``), without waiting for Train's controller to register it;
``reclaim_reports`` deletes what a stopped round stored that Train does not track;
and a (re)started worker group restores the newest checkpoint that is whole
(``restore_choice.newest_whole``: one the durable tier lost a file of is passed
over).
"""

from __future__ import annotations

import logging
import os

import pyarrow.fs as pafs
import ray
from ray.train import Checkpoint

from air_transfer.cluster import _ray_hooks
from air_transfer.cluster.nodes import this_node_id
from air_transfer.core.confine import checked_path, storage_path
from air_transfer.storage.client import placed_train, replica_train
from air_transfer.storage.client.directory_reads import read_directory
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.storage.client.restore_choice import newest_whole
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.copy import copy_tree
from air_transfer.storage.node_api import NodeCheckpoints, NodeDurable
from air_transfer.train import rounds
from air_transfer.train.upload import planned, store

logger = logging.getLogger(__name__)


def install() -> None:
    """Route Ray Train's checkpoint copies in this process through the functions
    below (once per process; ``AIR_TRANSFER_TRAIN_HOOKS=0`` leaves Ray untouched)."""
    _ray_hooks.install_train_hooks(upload_directory, download_directory, reclaim_reports, rounds)
    _ray_hooks.install_restore_choice(newest_whole)


def upload_directory(
    filesystem: pafs.FileSystem, path: str, checkpoint: Checkpoint, worker: str = ""
) -> Checkpoint | None:
    """Store ``checkpoint`` (a local directory) at ``path`` of a node storage
    ``filesystem`` as Ray Train's report does, for Train worker ``worker`` (its actor
    id); None for anything else (Ray copies), and for a directory holding a symlink:
    Ray's copy stores what each link points to, and skips a dangling one.

    Written by the storage node's agent, which notes it under ``worker`` until Train
    stops the worker's group (``reclaim_reports``): from this node's disk if that is
    the storage node, else packed by this node's agent while the storage node's
    agent writes what is packed so far (``plan.Route``).
    """
    handler = node_storage_handler(filesystem)
    if isinstance(handler, WriterPlacedHandler) and worker:  # Ray copies: noted first
        placed_train.note_report(handler, path, worker)
    return store(planned(filesystem, path, checkpoint, None, None, worker), filesystem, checkpoint)


def reclaim_reports(filesystem: pafs.FileSystem, workers: list[str], tracked: list[str]) -> None:
    """Ray Train is stopping the group of ``workers``: have the storage node's agent
    end their reports into node storage ``filesystem`` still being stored and delete
    those Train does not track (``tracked``: the paths it keeps). A failure is
    logged: Train goes on, and the orphans stay, as they would without the hooks."""
    handler = node_storage_handler(filesystem)
    if handler is None or not workers:
        return
    try:
        if isinstance(handler, WriterPlacedHandler):
            deleted = placed_train.reclaim(handler, workers, tracked)
        elif isinstance(handler, ReplicatedHandler):
            deleted = replica_train.reclaim(handler, workers, tracked)
        else:
            deleted = handler.link.call(
                NodeCheckpoints.reclaim_reports, handler.root, workers, tracked
            )
    except Exception as e:  # a cleanup: never fail Train's shutdown of the group
        logger.warning(
            "air-transfer: could not delete the checkpoints of a stopped Ray Train round "
            "from node storage (%s: %s); they stay in storage",
            type(e).__name__,
            e,
        )
        return
    if deleted:
        logger.info(
            "air-transfer: deleted %d checkpoint(s) Ray Train stopped before registering: %s",
            len(deleted),
            ", ".join(deleted),
        )


def download_directory(filesystem: pafs.FileSystem, path: str, local_path: str) -> bool:
    """Copy the checkpoint directory ``path`` of a node storage ``filesystem`` into
    ``local_path`` as Ray Train's restore does; False for anything else (Ray copies).

    On the storage node: a local copy. Elsewhere: the storage node's agent packs the
    directory once for all readers (``directory_transfers.DirectoryTransfers``: every
    reader in flight shares the one pack, whatever its size, or its relay on another
    reader's node: ``directory_reads``) and it is written here as any transfer is:
    verified, ``O_DIRECT``, published whole.
    """
    handler = node_storage_handler(filesystem)
    if handler is None:
        return False
    if isinstance(handler, ReplicatedHandler):
        return replica_train.download(handler, path, local_path)
    local = storage_path(handler.root, path)
    if handler.durable is not None:
        _, here, _ = handler.link.call(NodeDurable.durable_locate, handler.root, local)
        if not here:
            return False  # only in the durable tier: Ray copies, file by file, verified
    try:
        if ray.is_initialized() and handler.node_id == this_node_id():
            if not os.path.isdir(checked_path(handler.root, local)):
                return False  # which copy: ours reads confined, whatever changes now
            copy_tree(local, local_path, handler.config, root=handler.root)
            return True
        read_directory(handler.link, handler.root, local, handler.config, local_path)
    except NotADirectoryError:
        return False  # one file: Ray's own copy
    return True
