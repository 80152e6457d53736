"""The Trainer config option: Ray Train on several nodes with no shared storage.

Since Ray 2.7 every node must reach ``RunConfig(storage_path)`` (ray-project/ray#37177,
#46913). ``storage_filesystem()`` gives Train one: the files live on one node's disk
and every worker reaches them through that node's agent, in chunks::

    RunConfig(storage_path="/abs/dir", storage_filesystem=air_transfer.storage_filesystem())

``checkpoint_upload_fn`` is the per-report plug point instead, for a run that keeps
its own storage: ``ray.train.report(..., checkpoint_upload_fn=checkpoint_upload_fn)``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Callable
from contextlib import nullcontext

import pyarrow.fs as pafs
import ray
from ray.train import Checkpoint

from air_transfer.checkpoint import ChunkedCheckpoint
from air_transfer.cluster import _ray
from air_transfer.cluster.nodes import (
    NODE_FORMS,
    check_node_spec,
    head_node_id,
    resolve_node,
    this_node_id,
)
from air_transfer.config import Durable, StorageConfig, TransferConfig
from air_transfer.core import environ
from air_transfer.core.confine import checked_path, storage_path
from air_transfer.core.dirtree import Level, walk_dirs
from air_transfer.core.keywords import positional_at_most
from air_transfer.storage.client import replica_train
from air_transfer.storage.client.durable_wait import (
    StorageState,
    durable_now,
    wait_until_durable,
)
from air_transfer.storage.client.handler import NodeStorageHandler, node_storage_handler
from air_transfer.storage.client.incremental import store_incremental
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.storage.client.restore_choice import newest_whole
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.copy import copy_tree
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget, relative
from air_transfer.storage.node_api import NodeCheckpoints, NodeDurable, NodeReads
from air_transfer.storage.replica_wire import CopyState

logger = logging.getLogger(__name__)

_ray.require_train_v2()
# The settings a user sets on the driver reach Train's controller and workers with
# Ray Train's own: this module is imported by the driver (storage_filesystem,
# checkpoint_upload_fn, air_transfer.dcp) and by the controller (a run's storage).
_ray.propagate_to_train(environ.SETTINGS)


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
    settings = _storage_settings(storage, replicas, replica_nodes, replica_root, durable)
    config = _with_storage(config, storage)
    if node is not None:
        check_node_spec(node)
    for named in settings.replica_nodes:
        check_node_spec(named)
    if ray.is_initialized():
        node = this_node_id() if node is None else resolve_node(node)
        settings = settings.replace(
            replica_nodes=tuple(resolve_node(named) for named in settings.replica_nodes)
        )
    target = None
    if settings.durable is not None:
        target = DurableTarget.parse(settings.durable)
        if root.rstrip("/") == "":
            raise ValueError(
                "storage_filesystem(durable=...) needs a root of its own (root='/abs/dir'): "
                "the durable tier receives everything under the root"
            )
        target.check()
    drain = _drain_settings(settings, config) if target is not None else None
    if settings.replicas != 1 or settings.replica_nodes:
        handler = ReplicatedTrainHandler(
            node, root, config, settings.replicas, settings.replica_nodes, settings.replica_root,
            target, drain,
        )  # fmt: skip
        if ray.is_initialized():
            handler.settle()  # the copies are placed (and checked) now, by the maker
        return pafs.PyFileSystem(handler)
    return pafs.PyFileSystem(TrainStorageHandler(node, root, config, target, drain))


def _storage_settings(
    storage: StorageConfig | None,
    replicas: int,
    replica_nodes: tuple[str, ...],
    replica_root: str | None,
    durable: Durable | None,
) -> StorageConfig:
    """``storage``, or the keywords as a ``StorageConfig``; not both."""
    if storage is None:
        return StorageConfig(
            replicas=replicas,
            replica_nodes=tuple(replica_nodes),
            replica_root=replica_root,
            durable=durable,
        )
    if not isinstance(storage, StorageConfig):
        raise TypeError(f"storage must be a StorageConfig, got {type(storage).__name__}")
    if (replicas, tuple(replica_nodes), replica_root, durable) != (1, (), None, None):
        raise ValueError(
            "pass replicas, replica_nodes, replica_root and durable either as keywords "
            "or in storage=StorageConfig(...), not both"
        )
    return storage


def _with_storage(config: object, storage: StorageConfig | None) -> TransferConfig | None:
    """The transfers' config with ``storage``'s ``incremental`` and ``cache_bytes``."""
    if config is not None and not isinstance(config, TransferConfig):
        raise TypeError(f"config must be a TransferConfig, got {type(config).__name__}")
    if storage is None:
        return config
    base = config or TransferConfig()
    default = TransferConfig()
    if (base.incremental, base.cache_bytes) != (default.incremental, default.cache_bytes):
        raise ValueError(
            "set incremental and cache_bytes in storage=StorageConfig(...), not in the "
            "TransferConfig as well"
        )
    return base.replace(incremental=storage.incremental, cache_bytes=storage.cache_bytes)


def _drain_settings(storage: StorageConfig, config: TransferConfig | None) -> DrainSettings:
    """How the durable tier is fed, from the one ``StorageConfig`` (validated here,
    where the storage is made: a bad setting is an error of this call)."""
    return DrainSettings(
        concurrency=storage.durable_concurrency,
        bytes_per_s=storage.durable_bytes_per_s,
        chunk_bytes=(config or TransferConfig()).chunk_bytes,
        last=storage.durable_last,
        max_lag_bytes=storage.max_lag_bytes,
        scrub_s=storage.durable_scrub_s,
        scrub_bytes_per_s=storage.durable_scrub_bytes_per_s,
        read_wait_s=storage.durable_read_wait_s,
        part_bytes=storage.durable_part_bytes,
        codec=storage.durable_codec,
    )


def wait_durable(
    filesystem: pafs.FileSystem, path: str | None = None, timeout: float | None = None
) -> None:
    """Return once everything node storage ``filesystem`` acknowledged before this
    call (or at and under ``path``) is in its durable tier; TimeoutError after
    ``timeout`` seconds, naming what is still missing. Call it after
    ``Trainer.fit()`` and before the cluster goes: the run's last checkpoint then
    outlives it."""
    handler = _durable_handler(filesystem)
    rel = None if path is None else relative(handler.root, path)
    assert handler.durable is not None
    wait_until_durable(handler.drain_point, rel, handler.durable.uri, timeout)


def storage_state(filesystem: pafs.FileSystem, path: str) -> StorageState:
    """Where ``path`` of node storage ``filesystem`` stands: on how many nodes, and
    whether it is in the durable tier (``StorageState.tier``: local, replicated or
    durable). FileNotFoundError if no tier holds it."""
    handler = node_storage_handler(filesystem)
    if handler is None:
        raise TypeError("storage_state takes a storage_filesystem()")
    [info] = handler.get_file_info([path])  # node storage, then the durable tier
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    copies = handler.copies_holding(path)
    if handler.durable is None:
        return StorageState(path, copies, None)
    durable = durable_now(handler.drain_point, relative(handler.root, path))
    return StorageState(path, copies, durable)


def _durable_handler(filesystem: pafs.FileSystem) -> NodeStorageHandler:
    handler = node_storage_handler(filesystem)
    if handler is None or handler.durable is None:
        raise ValueError(
            "wait_durable takes a storage_filesystem(durable=...): this filesystem has "
            "no durable tier"
        )
    return handler


def replica_status(filesystem: pafs.FileSystem) -> list[CopyState]:
    """Every copy of a ``storage_filesystem(replicas=K)`` and its state: ``fresh``,
    ``syncing`` (being made again), ``stale``, ``failing`` (its repair failed and is
    tried again later) or ``failed`` (repair gave up: ``error`` says why; a copy is
    made on another node if one is free, and making the filesystem again retries it)."""
    handler = node_storage_handler(filesystem)
    if not isinstance(handler, ReplicatedHandler):
        raise TypeError(f"not a replicated node storage filesystem: {filesystem!r}")
    return handler.status()


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
    ``functools.partial``.

    ``node`` (a node id, IP address or ``"head"``, as for ``storage_filesystem``)
    defaults to the storage's node for a ``storage_filesystem()``, else the head
    node; into a ``storage_filesystem(replicas=K)`` the checkpoint is stored on every
    live copy, as a report is (``upload_checkpoint``). On a local filesystem the
    checkpoint appears whole and verified.
    """
    if node is not None:
        node = resolve_node(node)
    storage = ray.train.get_context().get_storage()
    dest = storage.build_checkpoint_path_from_name(checkpoint_dir_name)
    return upload_checkpoint(storage.storage_filesystem, dest, checkpoint, node, config)


def run_storage_filesystem() -> pafs.FileSystem | None:
    """The storage filesystem of the Ray Train run this process is a worker of
    (``RunConfig(storage_filesystem=)``, or the one Train made for its storage path);
    None outside a Train worker."""
    try:
        storage = ray.train.get_context().get_storage()
    except (RuntimeError, NotImplementedError, DeprecationWarning):
        return None  # not a Train worker; Train's local mode; a Tune trial
    filesystem: pafs.FileSystem = storage.storage_filesystem
    return filesystem


def upload_checkpoint(
    fs: pafs.FileSystem,
    dest: str,
    checkpoint: Checkpoint,
    node: str | None = None,
    config: TransferConfig | None = None,
) -> Checkpoint:
    """``checkpoint_upload_fn``'s work: ``checkpoint`` stored at ``dest`` of ``fs``.

    Into replicated node storage (``node`` unset or the storage node), a local
    directory is packed once and written by every copy's agent, failing over when
    the storage node is gone (``replica_train.upload_report``: never incremental,
    which would change one copy behind the others' backs); anything else is written
    by this node's agent through ``fs``, which keeps every copy.
    """
    handler = node_storage_handler(fs)
    source = local_directory(checkpoint)
    room = handler.admitted(directory_bytes(source)) if handler is not None else nullcontext()
    with room:  # a durable tier's max_lag_bytes
        if handler is not None and node in (None, handler.node_id):
            chosen = config or handler.config
            stored = source is not None and _store_directory(
                handler, dest, checkpoint, source, chosen, None
            )
            if stored:
                return Checkpoint(dest, filesystem=fs)
            # Written through ``fs``: by this node's agent into replicated storage
            # (``fs`` keeps every copy), else by the storage node's.
            node = this_node_id() if isinstance(handler, ReplicatedHandler) else handler.node_id
        link = AgentLink(node or head_node_id(), "/", config or TransferConfig())  # its errors
        _pack_and_store(
            checkpoint,
            config,
            lambda ref: link.call(NodeCheckpoints.store_checkpoint, ref, fs, dest),
        )
    return Checkpoint(dest, filesystem=fs)


class TrainStorageHandler(NodeStorageHandler):
    """``storage_filesystem()``'s handler: node storage, plus whole-directory copies
    for Ray Train. In every process that makes or receives one (the driver, each
    Train worker, the controller), Ray Train's checkpoint uploads and restores into
    and out of it go through ``upload_directory``/``download_directory``
    (``_ray.install_train_hooks``) rather than pyarrow's file-by-file copy: one
    chunked transfer, pipelined, written by the verified ``O_DIRECT`` writer and
    published whole; and ``reclaim_reports`` deletes what a stopped round stored."""

    def _constructed(self) -> None:
        _ray.install_train_hooks(upload_directory, download_directory, reclaim_reports)
        _ray.install_restore_choice(newest_whole)


class ReplicatedTrainHandler(ReplicatedHandler):
    """``storage_filesystem(replicas=K)``'s handler: node storage on K nodes, with
    Ray Train's hooks (``replica_train``) as ``TrainStorageHandler`` has them."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        _ray.install_train_hooks(upload_directory, download_directory, reclaim_reports)
        _ray.install_restore_choice(newest_whole)


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
    agent writes what is packed so far.
    """
    handler = node_storage_handler(filesystem)
    source = None if handler is None else local_directory(checkpoint)
    if handler is None or source is None:
        return None
    with handler.admitted(directory_bytes(source)):  # a durable tier's max_lag_bytes
        _store_directory(handler, path, checkpoint, source, handler.config, worker)
    return Checkpoint(path, filesystem=filesystem)


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


def local_directory(checkpoint: Checkpoint) -> str | None:
    """The absolute path of ``checkpoint`` if it is a directory of this node's local
    filesystem holding no symlink (what the modes of ``_store_directory`` take);
    else None."""
    if not isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        return None
    source = os.path.abspath(checkpoint.path)
    if not os.path.isdir(source) or holds_symlink(source):
        return None
    return source


def _store_directory(
    handler: NodeStorageHandler,
    dest: str,
    checkpoint: Checkpoint,
    source: str,
    config: TransferConfig,
    worker: str | None,
) -> bool:
    """Store ``checkpoint``, the local directory ``source``, at ``dest`` of node
    storage ``handler`` by the first mode that fits; False where none does (the
    caller's own way then).

    ``worker``: the Ray Train worker whose report this is (its actor id), whose
    storage the storage node's agent notes until Train stops the worker's group
    (``reclaim_reports``); None for ``checkpoint_upload_fn``. The modes:

    - replicated storage: packed once here, written by every copy's agent
      (``replica_train.upload_report``: never incremental, which would change one
      copy behind the others' backs);
    - ``config.incremental``: checksums first, only what storage lacks travels;
    - a report on the storage node: its agent reads this disk;
    - a report elsewhere: packed by this node's agent while the storage node's agent
      writes what is packed so far.
    """
    if isinstance(handler, ReplicatedHandler):
        if worker is None:
            worker = ray.get_runtime_context().get_actor_id() or ""
        replica_train.upload_report(handler, dest, source, worker, config)
        return True
    if config.incremental:
        link = handler.link
        if config != link.config:
            link = AgentLink(handler.node_id, handler.root, config)
        if store_incremental(link, source, dest, worker) is not None:
            return True
    if worker is None:
        return False
    report = worker
    if ray.is_initialized() and handler.node_id == this_node_id():
        handler.link.call(NodeCheckpoints.store_report, report, source, handler.root, dest, config)
    else:
        _pack_and_store(
            checkpoint,
            config,
            lambda ref: handler.link.call(
                NodeCheckpoints.store_report, report, ref, handler.root, dest, config
            ),
        )
    return True


def _pack_and_store(
    checkpoint: Checkpoint,
    config: TransferConfig | None,
    store: Callable[[ray.ObjectRef[ChunkedCheckpoint]], object],
) -> None:
    """Pack ``checkpoint`` (here, by this node's agent) while an agent stores what is
    packed so far (``store(ref)``, which returns once it is stored); returns then."""
    future = ChunkedCheckpoint.from_checkpoint(checkpoint).to_object_ref_async(config)
    # A top-level ref argument reaches the agent as the transferred checkpoint itself.
    store(future.ref)
    future.result()  # stored means packed, but any packing error is raised as such


def holds_symlink(directory: str) -> bool:
    """Whether the tree under ``directory`` holds a symlink (not followed)."""

    def visit(level: Level) -> list[str]:
        subdirs = []
        with os.scandir(level.fd) as entries:
            for entry in entries:
                if entry.is_symlink():
                    raise _SymlinkFound
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
        return subdirs

    top = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        walk_dirs(Level(top, -1, "", ""), visit)
    except _SymlinkFound:
        return True
    return False


class _SymlinkFound(Exception):
    """Ends ``holds_symlink``'s walk at the first symlink."""


def reclaim_reports(filesystem: pafs.FileSystem, workers: list[str], tracked: list[str]) -> None:
    """Ray Train is stopping the group of ``workers``: have the storage node's agent
    end their reports into node storage ``filesystem`` still being stored and delete
    those Train does not track (``tracked``: the paths it keeps). A failure is
    logged: Train goes on, and the orphans stay, as they would without the hooks."""
    handler = node_storage_handler(filesystem)
    if handler is None or not workers:
        return
    try:
        if isinstance(handler, ReplicatedHandler):
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
    directory once for all readers (``chunk_cache.DirectoryTransfers``: every reader
    in flight shares the one pack, whatever its size) and it is written here as any
    transfer is: verified, ``O_DIRECT``, published whole.
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
        [ref, lease] = handler.link.call(
            NodeReads.directory_transfer, handler.root, local, handler.config
        )
    except NotADirectoryError:
        return False  # one file: Ray's own copy
    try:
        ChunkedCheckpoint.from_object_ref(ref).to_directory(local_path)
    finally:
        _release(handler, lease)
    return True


def _release(handler: NodeStorageHandler, lease: str) -> None:
    """Tell the storage node's agent this restore is done with its transfer, so that
    it is kept only within the budget again; an agent gone meanwhile took the lease
    with it."""
    with contextlib.suppress(ray.exceptions.RayError):
        ray.get(handler.link.agent().call(NodeReads.release_directory_transfer, lease))
