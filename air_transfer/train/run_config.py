"""``run_config()``: Ray Train's ``RunConfig`` over node storage in one call, the
root said once, and every setting checked before ``fit()`` starts Train's
controller."""

from __future__ import annotations

import os
import posixpath
from typing import Any

import ray.train

from air_transfer.config import StorageConfig, TransferConfig
from air_transfer.train.filesystem import storage_filesystem
from air_transfer.train.root import storage_root


def run_config(
    *,
    root: str | None = None,
    node: str | None = None,
    config: TransferConfig | None = None,
    storage: StorageConfig | None = None,
    expose_system_dirs: bool = False,
    **options: Any,
) -> ray.train.RunConfig:
    """A Ray Train ``RunConfig`` whose storage is node storage under ``root``, so that
    the root is said once: its ``storage_filesystem`` is ``storage_filesystem(...)``
    of these settings and its ``storage_path`` the root (or the ``storage_path``
    given, a directory inside it). The run's files are ``root/name/...`` on the
    storage node. Made before ``ray.init``, what needs Ray is checked as
    ``Trainer.fit()`` ships the run's storage, before Train's controller starts:
    ``fit()`` raises it as itself.

    Why a function returning Ray's own ``RunConfig``: it is what Trainers take and
    Ray documents, every option of it stays available (and ``dataclasses.replace``
    works on it); the filesystem is a ``pyarrow`` class, and a subclass of
    ``RunConfig`` would be one more type to keep in step with Ray's.

    Args:
        root: the directory the run's storage lives under (default
            ``~/air_transfer`` of this process), as ``storage_filesystem(root=)``.
        node: the storage node, as ``storage_filesystem(node=)``.
        config: the transfers' chunk size and window.
        storage: replicas, incremental saves and the durable tier
            (``StorageConfig``).
        expose_system_dirs: allow a root that exposes system directories.
        **options: ``RunConfig``'s own options (``name``, ``storage_path`` inside
            the root, ``failure_config``, ``checkpoint_config``...).

    Returns:
        A ``ray.train.RunConfig``.

    Raises:
        ValueError: a ``storage_path`` outside the root, a root that would expose
            system directories; where Ray runs, more ``storage.replicas`` than live
            nodes.
        NotADirectoryError: where Ray runs, a root that is a file on the storage node.
        TypeError: ``storage_filesystem=`` given (this makes it).
    """
    if "storage_filesystem" in options:
        raise TypeError(
            "run_config() makes the storage filesystem itself: pass its settings "
            "(root=, node=, config=, storage=StorageConfig(...)) instead of "
            "storage_filesystem="
        )
    top = storage_root(root, expose_system_dirs)
    path = _storage_path(options.pop("storage_path", None), top)
    fs = storage_filesystem(
        node=node, config=config, root=top, storage=storage, expose_system_dirs=expose_system_dirs
    )
    return ray.train.RunConfig(storage_path=path, storage_filesystem=fs, **options)


def _storage_path(given: str | os.PathLike[str] | None, root: str) -> str:
    """The run's ``storage_path``: ``root``, or ``given`` (a relative one is taken
    under the root, as node storage takes it) if it lies inside the root."""
    if given is None:
        return root
    path = posixpath.normpath(posixpath.join(root, os.fspath(given)))
    if path != root and not path.startswith(root.rstrip("/") + "/"):
        raise ValueError(
            f"storage_path {os.fspath(given)!r} is outside the storage root {root!r}: node "
            "storage refuses every path outside its root, so Ray Train could write "
            "nothing there; pass a storage_path inside the root, or leave it out (it "
            "is the root by default)"
        )
    return path
