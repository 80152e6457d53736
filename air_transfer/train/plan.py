"""How a checkpoint is uploaded, decided as data before anything moves: one pure
function (``plan_upload``) picks the route from where the checkpoint and the
storage are, as ``transfer.packers.select_packer`` picks a packer; ``upload.store``
then carries the plan out, once.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import pyarrow.fs as pafs
from ray.train import Checkpoint

from air_transfer.config import TransferConfig
from air_transfer.core.dirtree import Level, walk_dirs


class Route(enum.Enum):
    """Who stores a checkpoint, and from what."""

    #: Ray Train copies it itself (a report hook declining).
    RAY = "ray"
    #: Packed once here, every copy's agent storing it (replicated node storage;
    #: never incremental, which would change one copy behind the others' backs).
    REPLICAS = "replicas"
    #: Checksums first: only the chunks the storage node lacks travel.
    INCREMENTAL = "incremental"
    #: A report on the storage node: its agent reads this node's disk.
    FROM_DISK = "from_disk"
    #: A report elsewhere: packed here while the storage node's agent stores what is
    #: packed so far.
    PACKED = "packed"
    #: Packed here while the agent of ``UploadPlan.node`` writes it through the
    #: filesystem (``checkpoint_upload_fn`` into any pyarrow filesystem).
    THROUGH_FS = "through_fs"


@dataclass(frozen=True)
class UploadPlan:
    """An upload decided: its ``route``, where it goes (``dest``), with which
    ``config``, from which local directory (``source``, for the routes that read
    one), by whose agent (``node``, for ``THROUGH_FS``), and for which Ray Train
    worker (``worker``: its actor id, whose reports the storage node's agent notes
    until Train stops its group; None for ``checkpoint_upload_fn``)."""

    route: Route
    dest: str
    config: TransferConfig
    source: str | None = None
    node: str | None = None
    worker: str | None = None


@dataclass(frozen=True)
class NodeStorage:
    """What a plan needs to know of node storage: its node, whether it keeps copies,
    and its transfers' config."""

    node: str
    replicated: bool
    config: TransferConfig
    #: Its large files' bytes stay on their writer's node (``placement="writer"``).
    placed: bool = False


def plan_upload(
    dest: str,
    config: TransferConfig | None,
    *,
    storage: NodeStorage | None,
    source: str | None,
    node: str | None,
    here: str | None,
    worker: str | None,
) -> UploadPlan:
    """The plan for storing a checkpoint at ``dest``: into node ``storage`` (None:
    another filesystem), from ``source`` (its local directory holding no symlink,
    else None), by the agent of ``node`` if the caller named one, from node ``here``
    (None: Ray is not running), as ``worker``'s report (None: ``checkpoint_upload_fn``,
    whose uploads always happen). The first rule that applies:

    1. ``RAY`` for a report that node storage cannot take (another filesystem, or
       not a local directory): Ray Train copies it;
    2. into node storage, from a local directory, by the storage node (``node``
       unset or the storage's): ``REPLICAS`` for replicated storage, else
       ``INCREMENTAL`` with ``config.incremental``, else for a report ``FROM_DISK``
       on the storage node and ``PACKED`` elsewhere;
    3. ``THROUGH_FS``: into replicated storage by this node's agent (its filesystem
       keeps every copy) unless ``node`` names another, into node storage by the
       storage node's, else by ``node``'s (None: the head node's).

    Into node storage with ``placement="writer"``, whose bytes must leave from the
    writing process's node: ``RAY`` for a report (Ray Train copies it through the
    filesystem, in the worker), else ``THROUGH_FS`` by this node's agent unless
    ``node`` names another.

    ``config`` unset is the storage's for node storage's own routes, else the default.
    Pure: it reads its arguments only.
    """
    if storage is not None and storage.placed:
        if worker is not None:
            return UploadPlan(Route.RAY, dest, config or storage.config)
        by = here if node in (None, storage.node) else node
        return UploadPlan(Route.THROUGH_FS, dest, config or storage.config, None, by, None)
    if worker is not None and (storage is None or source is None):
        return UploadPlan(Route.RAY, dest, config or TransferConfig())
    if storage is not None and source is not None and node in (None, storage.node):
        chosen = config or storage.config
        if storage.replicated:
            route = Route.REPLICAS
        elif chosen.incremental:
            route = Route.INCREMENTAL
        elif worker is None:
            route = Route.THROUGH_FS
        else:
            route = Route.FROM_DISK if here == storage.node else Route.PACKED
        if route is not Route.THROUGH_FS:
            return UploadPlan(route, dest, chosen, source, storage.node, worker)
    if storage is not None and node in (None, storage.node):
        node = here if storage.replicated else storage.node
    return UploadPlan(Route.THROUGH_FS, dest, config or TransferConfig(), None, node, worker)


def local_directory(checkpoint: Checkpoint) -> str | None:
    """The absolute path of ``checkpoint`` if it is a directory of this node's local
    filesystem holding no symlink (what node storage's routes take); else None."""
    if not isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        return None
    source = os.path.abspath(checkpoint.path)
    if not os.path.isdir(source) or holds_symlink(source):
        return None
    return source


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
