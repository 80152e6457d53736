"""Where a node storage and its paths stand: in how many copies, whether in the
durable tier, and the run's own storage as a Train worker sees it."""

from __future__ import annotations

import errno
import os

import pyarrow.fs as pafs
import ray.train

from air_transfer.storage.client.durable_wait import (
    StorageState,
    durable_now,
    wait_until_durable,
)
from air_transfer.storage.client.handler import NodeStorageHandler, node_storage_handler
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.storage.durable.target import relative
from air_transfer.storage.replica_wire import CopyState


def wait_durable(
    filesystem: pafs.FileSystem, path: str | None = None, timeout: float | None = None
) -> None:
    """Return once everything node storage acknowledged before this call is in its
    durable tier, confirmed there. Call it after ``Trainer.fit()`` and before the
    cluster goes: the run's last checkpoint then outlives it.

    Args:
        filesystem: a ``storage_filesystem(durable=...)``.
        path: only what is at and under this path (default: everything).
        timeout: seconds to wait at most (default: no limit).

    Raises:
        TimeoutError: after ``timeout`` seconds, naming what is still missing,
            what is stuck and the drain's last error.
        ValueError: ``filesystem`` has no durable tier.
    """
    handler = _durable_handler(filesystem)
    rel = None if path is None else relative(handler.root, path)
    assert handler.durable is not None
    wait_until_durable(handler.drain_point, rel, handler.durable.uri, timeout)


def storage_state(filesystem: pafs.FileSystem, path: str) -> StorageState:
    """Where a path of node storage stands now: on how many nodes, and whether the
    durable tier holds it as node storage does (asked of the tier itself).

    Args:
        filesystem: a ``storage_filesystem()``.
        path: a file or directory of it.

    Returns:
        Its ``StorageState`` (``.tier``: ``local``, ``replicated`` or ``durable``).

    Raises:
        FileNotFoundError: no tier holds ``path``.
        TypeError: ``filesystem`` is not node storage.
    """
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
    """Every copy of a replicated node storage and its state.

    Args:
        filesystem: a ``storage_filesystem(replicas=K)``.

    Returns:
        One ``CopyState`` a copy: ``fresh``, ``syncing`` (being made again),
        ``stale``, ``failing`` (its repair failed and is tried again later) or
        ``failed`` (repair gave up: ``error`` says why; a copy is made on another
        node if one is free, and making the filesystem again retries it).

    Raises:
        TypeError: ``filesystem`` is not replicated node storage.
    """
    handler = node_storage_handler(filesystem)
    if not isinstance(handler, ReplicatedHandler):
        raise TypeError(f"not a replicated node storage filesystem: {filesystem!r}")
    return handler.status()


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
