"""The running cluster, as a command sees it: the connection, the node a path names,
and node storage opened as the run that wrote it opened it.

A command opens node storage with the settings the run used, so that it changes
nothing the run relies on: a storage the replica registry knows is opened with its
copies (a write reaches every copy; a read fails over), and a durable tier is used
only where the storage node's agent already drains that root into it (opening it
otherwise would start a drain of this root: a command never does).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

import pyarrow.fs as pafs
import ray

from air_transfer.cli.address import NodePath, OtherPath
from air_transfer.cli.connect import HANDSHAKE_TIMEOUT_S, join, say
from air_transfer.cluster.nodes import NAMESPACE, REGISTRY_NAME, resolve_node
from air_transfer.config import TransferConfig
from air_transfer.storage.client import replica_set
from air_transfer.storage.client.handler import NodeStorageHandler, node_storage_handler
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.durable.view import TierView, find_tier
from air_transfer.storage.node_api import NodeDurable
from air_transfer.storage.replica_wire import RegistryCalls, key_parts, storage_key
from air_transfer.train import storage_filesystem

#: The transfers of a command: no per-file bars (a command draws one for the whole).
CONFIG = TransferConfig(progress=False)


def connect(address: str, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
    """Join the running Ray cluster at ``address`` (``auto``: the one this machine
    belongs to) as a driver, and say which on stderr; ConnectionError naming the
    address and the cause within ``timeout_s`` if it cannot (``cli.connect``)."""
    say(join(address, timeout_s))


def node_id(spec: str | None) -> str:
    """The id of the live node ``spec`` names (None: the head node)."""
    return resolve_node(spec or "head")


@dataclass(frozen=True)
class Storage:
    """Node storage as the run opened it: ``filesystem`` with its storage ``root`` on
    node ``node``; ``copies``, the (node, root) of each fresh copy of a replicated one
    (else the one), and ``members``, every copy the registry names (stale ones too);
    ``durable``, the URI of the durable tier it drains into; ``replica_root``, where
    a replicated one's copies (and a writer-placed one's holders) live."""

    node: str
    root: str
    filesystem: pafs.FileSystem
    copies: tuple[tuple[str, str], ...]
    members: tuple[tuple[str, str], ...]
    durable: str | None = None
    replica_root: str | None = None

    def copy_filesystem(self, node: str, root: str) -> pafs.FileSystem:
        """One copy's files alone (a replicated storage's copy on ``node``)."""
        if (node, root) == (self.node, self.root) and len(self.copies) == 1:
            return self.filesystem
        return storage_filesystem(node=node, config=CONFIG, root=root)


def open_storage(
    path: NodePath,
    default_node: str | None,
    durable: str | None = None,
    *,
    root: str | None = None,
    expose_system_dirs: bool = False,
) -> Storage:
    """Node storage holding ``path``: the registry's replicated storage whose root
    holds it if there is one, else a storage rooted at ``root`` (default: ``path``
    itself, which must exist; ``expose_system_dirs`` as ``storage_filesystem`` takes
    it); with ``durable``, the durable tier the storage node's agent drains ``path``
    into (see the module)."""
    node = node_id(path.node or default_node)
    if durable is not None:
        _require_draining(node, path.path, durable)
        # Reads only: a handler without drain settings never attaches a drain.
        tier = DurableTarget.parse(durable)
        fs = pafs.PyFileSystem(NodeStorageHandler(node, path.path, CONFIG, tier, drain=None))
        one = ((node, path.path),)
        return Storage(node, path.path, fs, one, one, durable)
    found = _replicated(node, path.path)
    if found is None:
        top = root or path.path
        fs = storage_filesystem(
            node=node, config=CONFIG, root=top, expose_system_dirs=expose_system_dirs
        )
        one = ((node, top),)
        return Storage(node, top, fs, one, one)
    replicated, members, fresh, replicas = found
    # As the run made it: the registry keeps where its copies live (replica_root).
    template = replica_set.call(RegistryCalls.template, storage_key(node, replicated))
    fs = storage_filesystem(
        node=node, config=CONFIG, root=replicated, replicas=replicas, replica_root=template
    )
    return Storage(node, replicated, fs, fresh, members, replica_root=template)


def placed_handler(storage: Storage) -> WriterPlacedHandler | None:
    """``storage`` opened with ``placement="writer"``, for what only that handler does
    (its placed bytes swept), if the registry's copies of it live under a
    ``replica_root`` with ``{node_id}`` in it (as such a storage's must); else None."""
    key = storage_key(storage.node, storage.root)
    view = replica_set.view(key) if len(storage.members) > 1 else None
    if view is None:
        return None
    template = replica_set.call(RegistryCalls.template, key)
    if not isinstance(template, str) or "{node_id}" not in template:
        return None
    fs = storage_filesystem(
        node=storage.node,
        config=CONFIG,
        root=storage.root,
        replicas=int(view[3]),
        replica_root=template,
        placement="writer",
    )
    handler = node_storage_handler(fs)
    return handler if isinstance(handler, WriterPlacedHandler) else None


def open_other(path: OtherPath) -> tuple[pafs.FileSystem, str]:
    """A filesystem and path for a URI (pyarrow's, else fsspec's) or a local path;
    ValueError for a URI that names no path (``s3://``)."""
    if not path.is_uri:
        return pafs.LocalFileSystem(), posixpath.abspath(path.text)
    try:
        fs, where = pafs.FileSystem.from_uri(path.text)
    except (ValueError, TypeError, OSError) as e:
        pyarrow_error = e
    else:
        return fs, _named(path, str(where))
    try:
        import fsspec.core  # type: ignore[import-untyped]
    except ImportError:
        raise ValueError(
            f"{path.text!r} is not a URI pyarrow opens ({pyarrow_error}); for other "
            "schemes install fsspec and its backend (pip install fsspec s3fs ...)"
        ) from pyarrow_error
    spec_fs, where = fsspec.core.url_to_fs(path.text)
    return pafs.PyFileSystem(pafs.FSSpecHandler(spec_fs)), _named(path, str(where))


def through_tier(fs: pafs.FileSystem, path: str) -> pafs.FileSystem:
    """``fs`` seen through the durable tier ``path`` lies in, if it does (files read
    by the tier's manifests, decoded by their codec, every chunk checked); else
    ``fs`` itself."""
    target = find_tier(fs, path)
    return fs if target is None else pafs.PyFileSystem(TierView(target))


def _named(path: OtherPath, where: str) -> str:
    """``where``, the path ``path`` names on its filesystem, unless it names none."""
    if not where.strip("/"):
        scheme = path.text.partition("://")[0]
        raise ValueError(
            f"{path.text!r} names no path: give the whole of it ({scheme}://BUCKET/PATH)"
        )
    return where


Copies = tuple[tuple[str, str], ...]


def _replicated(node: str, path: str) -> tuple[str, Copies, Copies, int] | None:
    """The root, the copies, the fresh ones and K of the replicated storage on ``node`` whose
    root holds ``path``, if the cluster's replica registry knows one (asked only if
    it runs: a command starts no registry)."""
    try:
        ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)
    except ValueError:
        return None
    best: str | None = None
    for key in replica_set.call(RegistryCalls.keys):
        owner, root = key_parts(str(key))
        holds = root == "/" or path == root or path.startswith(root + "/")
        if owner == node and holds and (best is None or len(root) > len(best)):
            best = root
    if best is None:
        return None
    view = replica_set.view(storage_key(node, best))
    if view is None:
        return None
    copies, fresh, _, replicas = view
    members = tuple((str(n), str(r)) for n, r in copies)
    return best, tuple(c for c in members if c[0] in fresh), members, int(replicas)


def _require_draining(node: str, root: str, durable: str) -> None:
    """ValueError unless the agent of ``node`` drains node storage ``root`` into a
    durable tier (which ``storage_filesystem`` then checks is ``durable``)."""
    link = AgentLink(node, root, CONFIG)
    try:
        link.call(NodeDurable.durable_status, root)
    except ValueError as e:
        raise ValueError(
            f"the agent of node {node[:12]} drains no durable tier for node storage {root!r}: "
            f"--durable {durable} is for a root that a run's storage_filesystem(root=..., "
            "durable=...) drains; give that root exactly"
        ) from e
