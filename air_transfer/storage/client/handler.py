"""Node storage, the caller side: ``NodeStorageHandler``, a pyarrow filesystem whose
files live on one node's disk and are reachable from every node of the cluster.

Runs in whichever process uses the filesystem (the driver, Train workers). Metadata
operations are calls to the storage node's agent (``disk`` methods, over the
``streams.AgentLink``); file bodies move in chunks through the object store
(``streams``). Every method is a thin adapter, as in pyarrow's own ``FSSpecHandler``.
"""

from __future__ import annotations

import errno
import os
import posixpath
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import ray

from air_transfer.cluster.liveness import this_process
from air_transfer.cluster.nodes import (
    names_a_node_by_role_or_address,
    resolve_node,
    this_node_id,
)
from air_transfer.config import TransferConfig
from air_transfer.core.confine import storage_path
from air_transfer.core.reader import buffered
from air_transfer.core.threads import pool
from air_transfer.observe.telemetry import NODE_STORAGE, Transfer, describe
from air_transfer.storage.client.durable_wait import DrainPoint, admitted
from air_transfer.storage.client.same_node import open_native
from air_transfer.storage.client.streams import AgentLink, open_reader
from air_transfer.storage.client.upload_copies import Mode, Route, Staged
from air_transfer.storage.client.uploads import NodeUpload
from air_transfer.storage.durable.reads import open_verified
from air_transfer.storage.durable.records import FileRecord
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget, relative
from air_transfer.storage.location import NodeStorageLocation
from air_transfer.storage.node_api import NodeDurable, NodeFiles, NodeMetadata


class NodeStorageHandler(pafs.FileSystemHandler):
    """Files under ``root`` on node ``node_id``, through that node's agent.

    Paths are the node's own absolute paths (a relative one is taken under ``root``);
    one leaving ``root`` is refused with PermissionError. ``node_id=None`` means the
    node of the process that first uses or ships the filesystem (the driver's, when
    made there); an IP address or ``"head"`` (``nodes.resolve_node``) is resolved to
    its node id there too. Copies compare equal: same node, same root.

    ``setup``: what every process that makes or receives the filesystem runs first
    (Ray Train's hooks, ``train.hooks.install``): called here, and again wherever a
    copy is unpickled, as ``__reduce__`` constructs it again; a module-level function,
    so that pickling names it and unpickling imports its module.
    """

    def __init__(
        self,
        node_id: str | None,
        root: str = "/",
        config: TransferConfig | None = None,
        durable: DurableTarget | None = None,
        drain: DrainSettings | None = None,
        setup: Callable[[], object] | None = None,
    ) -> None:
        if not isinstance(root, str) or not root.startswith("/"):
            raise ValueError(f"the storage root must be an absolute path, got {root!r}")
        self.root = posixpath.normpath(root).replace("//", "/")
        self.config = config or TransferConfig()
        #: The durable tier the storage node's agent drains this storage into.
        self.durable = durable
        #: How it drains; None: this handler only reads the tier and never attaches
        #: a drain (``air-transfer``'s commands, a storage opened to look at it).
        self.drain = drain
        self._node_id = node_id
        self._link: AgentLink | None = None
        self._local: bool | None = None
        self._attached_to = 0  # the agent (``AgentLink.agents_made``) last attached
        self.setup = setup
        #: What the maker checks once Ray runs, for a filesystem made before
        #: ``ray.init``: run as this handler is first shipped from its process (Ray
        #: Train's ``fit()`` ships it to its controller), so that what it raises is
        #: raised there, as itself. Not pickled: copies elsewhere check nothing.
        self.checks_when_shipped: Callable[[], None] | None = None
        if setup is not None:
            setup()

    @property
    def node_id(self) -> str:
        if self._node_id is None:
            self._node_id = this_node_id()
        elif names_a_node_by_role_or_address(self._node_id):
            self._node_id = resolve_node(self._node_id)
        return self._node_id

    @property
    def location(self) -> NodeStorageLocation:
        """Which node's disk and which root (``storage.location``)."""
        return NodeStorageLocation(self.node_id, self.root)

    @property
    def link(self) -> AgentLink:
        """The connection to the storage node's agent, its durable tier attached
        (``attach``) before the first call of this process to each agent."""
        if self._link is None:
            self._link = AgentLink(self.node_id, self.root, self.config)
        self.attach(self._link)
        return self._link

    def attach(self, link: AgentLink) -> None:
        """Have the agent behind ``link`` drain this storage into its durable tier and
        read through to it, unless it was told so by this process already: the one
        step that starts a drain, taken by a storage that drains (``drain`` set)."""
        if self.durable is None or self.drain is None:
            return
        link.agent()  # reached: its count says whether it is a new agent
        if self._attached_to != link.agents_made:
            self._attach_durable(link)
            self._attached_to = link.agents_made

    def _attach_durable(self, link: AgentLink) -> None:
        """Have the storage node's agent drain this storage into its durable tier."""
        durable, drain = self.durable, self.drain
        assert durable is not None and drain is not None  # called only with a tier
        link.call(NodeDurable.durable_attach, self.root, durable, drain, None)

    def copies_holding(self, path: str) -> int:
        """On how many nodes node storage holds ``path`` now (0: not at all; the
        durable tier may)."""
        local = self._path(path)
        if self.durable is None:
            [(ftype, _, _)] = self.link.call(NodeMetadata.fs_info, self.root, [local])
            return int(ftype != pafs.FileType.NotFound)
        _, here, _ = self.link.call(NodeDurable.durable_locate, self.root, local)
        return int(here)

    def drain_point(self) -> DrainPoint:
        """The agent that drains this storage into its durable tier, and its root."""
        return self.node_id, self.root, self.link

    def durable_whole(self, path: str) -> tuple[bool, str]:
        """Whether the durable tier holds ``path`` whole now (its manifests, each
        object as the drain confirmed it), and if not, what is wrong."""
        rel = relative(self.root, self._path(path))
        _, root, link = self.drain_point()
        whole, why = link.call(NodeDurable.durable_whole, root, posixpath.join(root, rel))
        return whole, why

    def _shipped(self) -> None:
        """Run the maker's pending checks (``checks_when_shipped``) once Ray runs;
        they stay pending while they raise. On a thread of their own: this runs in
        the middle of Ray's serializer, whose state (the refs an object holds) is
        per thread, and the checks call agents, which serializes their arguments."""
        checks = self.checks_when_shipped
        if checks is not None and ray.is_initialized():
            with pool("air-transfer-storage-checks", 1) as thread:
                thread.submit(checks).result()
            self.checks_when_shipped = None

    def __reduce__(self) -> tuple[Any, ...]:
        self._shipped()
        # Shipped by Ray, it names its node (the sender's if not yet known): a copy
        # unpickled elsewhere must not take its own node for the storage's.
        node = self.node_id if ray.is_initialized() else self._node_id
        return (type(self), (node, self.root, self.config, self.durable, self.drain, self.setup))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NodeStorageHandler):
            return False
        if ray.is_initialized():
            return (self.node_id, self.root) == (other.node_id, other.root)
        return (self._node_id, self.root) == (other._node_id, other.root)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.root)

    def __repr__(self) -> str:
        node = self._node_id[:12] if self._node_id else "<first user's node>"
        return f"NodeStorageHandler(node={node}, root={self.root!r})"

    def get_type_name(self) -> str:
        return "air-transfer-node"

    def normalize_path(self, path: str) -> str:
        return path

    def _path(self, path: str) -> str:
        return storage_path(self.root, path)

    # -- metadata ----------------------------------------------------------------------
    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        local = [self._path(p) for p in paths]
        infos = self.link.call(NodeMetadata.fs_info, self.root, local)
        pairs = zip(paths, infos, strict=True)
        return [pafs.FileInfo(p, t, mtime_ns=m, size=s) for p, (t, s, m) in pairs]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base = selector.base_dir
        where, recursive, missing_ok = (
            self._path(base),
            selector.recursive,
            selector.allow_not_found,
        )
        found = self.link.call(NodeMetadata.fs_list, self.root, where, recursive, missing_ok)
        prefix = base.rstrip("/") + "/" if base.strip("/") else base[:1]
        return [pafs.FileInfo(prefix + rel, t, mtime_ns=m, size=s) for rel, t, s, m in found]

    def create_dir(self, path: str, recursive: bool) -> None:
        local = self._path(path)
        self.link.call(NodeMetadata.fs_create_dir, self.root, local, recursive)

    def delete_dir(self, path: str) -> None:
        local = self._path(path)
        self.link.call(NodeMetadata.fs_delete_dir, self.root, local)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        local = self._path(path)
        self.link.call(NodeMetadata.fs_delete_dir_contents, self.root, local, missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.link.call(NodeMetadata.fs_delete_dir_contents, self.root, self.root, False)

    def delete_file(self, path: str) -> None:
        local = self._path(path)
        self.link.call(NodeMetadata.fs_delete_file, self.root, local)

    def move(self, src: str, dest: str) -> None:
        a, b = self._path(src), self._path(dest)
        self.link.call(NodeMetadata.fs_move, self.root, a, b)

    def copy_file(self, src: str, dest: str) -> None:
        a, b = self._path(src), self._path(dest)
        self.link.call(NodeFiles.fs_copy_file, self.root, a, b)

    # -- file bodies -------------------------------------------------------------------
    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self._open_input(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self._open_input(path)

    def open_output_stream(
        self, path: str, metadata: pa.KeyValueMetadata | None = None
    ) -> pa.NativeFile:
        return self._open_output(path, append=False)

    def open_append_stream(
        self, path: str, metadata: pa.KeyValueMetadata | None = None
    ) -> pa.NativeFile:
        return self._open_output(path, append=True)

    def _on_storage_node(self) -> bool:
        """Whether this process runs on the storage node (its files are local)."""
        if self._local is None:
            self._local = ray.is_initialized() and this_node_id() == self.node_id
        return self._local

    def _open_input(self, path: str) -> pa.NativeFile:
        local = self._path(path)
        if self._on_storage_node():
            try:
                return open_native(self.root, local)
            except FileNotFoundError:
                if self.durable is None:
                    raise
        if self.durable is not None:
            (ftype, size, _), here, record = self.link.call(
                NodeDurable.durable_locate, self.root, local
            )
            if not here:
                return self._open_durable(path, local, ftype, record)
        else:
            [(ftype, size, _)] = self.link.call(NodeMetadata.fs_info, self.root, [local])
        if ftype == pafs.FileType.NotFound:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        if ftype != pafs.FileType.File or size is None:
            raise IsADirectoryError(errno.EISDIR, "Cannot open for reading", path)
        return pa.PythonFile(open_reader(self.link, path, local, size), mode="r")

    def _open_durable(
        self, path: str, local: str, ftype: int, record: FileRecord | None
    ) -> pa.NativeFile:
        """``path``, held only in the durable tier: read from there by its manifest's
        record, each chunk checked against it (``storage.durable.reads``), straight
        from this process."""
        assert self.durable is not None
        if ftype == pafs.FileType.NotFound:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        if ftype != pafs.FileType.File or record is None:
            raise IsADirectoryError(errno.EISDIR, "Cannot open for reading", path)
        reader = open_verified(self.durable, relative(self.root, local), record)
        return pa.PythonFile(buffered(reader, self.config.chunk_bytes), mode="r")

    def admitted(self, nbytes: int) -> AbstractContextManager[None]:
        """With a durable tier and ``max_lag_bytes``: hold a report of ``nbytes``
        while the bytes not yet in the tier, with it, would pass the limit (a
        report's backpressure; logged once per wait), and keep its room until it is
        stored."""
        limit = self.drain.max_lag_bytes if self.drain is not None else None
        if self.durable is None or limit is None:
            return nullcontext()
        return admitted(self.drain_point, nbytes, limit, self.durable.uri)

    def _open_output(self, path: str, append: bool) -> pa.NativeFile:
        local = self._path(path)
        process = this_process()  # its death discards the upload
        staging, start, expect = self.link.call(
            NodeFiles.fs_open_write, self.root, local, append, process
        )
        indexed = self.config.incremental and not start  # checksums first (not an append)
        # On the storage node, the bytes go straight into the staging file.
        route = Route.HERE if self._on_storage_node() else Route.OFFER if indexed else Route.SEND
        mode = Mode(route, indexed, self.config.direct_io)
        copy = Staged(self.node_id, self.link, local, staging, start, expect)
        writer = NodeUpload(mode, [copy], self.config, local, self._upload(local))
        return pa.PythonFile(writer, mode="w")

    def _upload(self, local: str) -> Transfer:
        """The metrics and progress of one file written (phase ``upload``)."""
        transfer = Transfer(
            "upload",
            strategy=NODE_STORAGE,
            total=None,
            desc=describe(local, "write"),
            progress=self.config.progress,
        )
        return transfer.start()


def node_storage_handler(fs: pafs.FileSystem) -> NodeStorageHandler | None:
    """The handler behind ``fs`` if it is a node storage filesystem, else None."""
    handler = getattr(fs, "handler", None) if isinstance(fs, pafs.PyFileSystem) else None
    return handler if isinstance(handler, NodeStorageHandler) else None
