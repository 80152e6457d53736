"""Node storage on K nodes: ``ReplicatedHandler``, the pyarrow handler of a
``storage_filesystem(replicas=K)``.

Every change (a file written, a directory made, a delete, a move) goes to every
copy the registry names (``replica_set``), each applied by its own node's agent, and
returns once every live copy took it; a copy that missed it is marked stale before
the call returns, so no later read uses it. Reads, listings and infos go to one
fresh copy (``replica_set.read_order``) and fail over to the next when its node or
agent is gone, mid-read included. The paths callers use are those under ``root`` on
the first storage node; copy i keeps the same relative paths under its own root.
Which copies there are, and how a read or a change reaches them, is the base class's
(``replica_copies.ReplicaCopies``); this module is the pyarrow handler over it.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import ray

from air_transfer.cluster.nodes import this_node_id
from air_transfer.core.reader import ChunkFileReader, buffered
from air_transfer.storage.client import replica_set
from air_transfer.storage.client.replica_copies import ReplicaCopies
from air_transfer.storage.client.replica_set import is_lost
from air_transfer.storage.client.replica_write import ReplicaWrite
from air_transfer.storage.client.same_node import open_native
from air_transfer.storage.client.streams import _chunks, read_chunk_bytes
from air_transfer.storage.client.upload_copies import Mode, Route, Staged, abort_copy
from air_transfer.storage.client.uploads import NodeUpload
from air_transfer.storage.durable.reads import open_verified
from air_transfer.storage.node_api import NodeDurable, NodeFiles, NodeMetadata
from air_transfer.storage.replica_wire import RegistryCalls, on_copy

logger = logging.getLogger(__name__)


class ReplicatedHandler(ReplicaCopies):
    """Files under ``root``, kept on ``replicas`` nodes: ``node_id`` (the storage
    node), the ``nodes`` named, then others the registry picks; a copy on node n
    lives under ``replica_root.format(node_id=n)`` (default: ``root`` on each).
    Made by ``storage_filesystem``, whose ``StorageConfig`` has checked these."""

    # -- metadata ----------------------------------------------------------------------
    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        rels = [self.rel(p) for p in paths]
        infos = self.read(
            "answer",
            lambda link, root: link.call(
                NodeMetadata.fs_info, root, [on_copy(root, r) for r in rels]
            ),
        )
        pairs = zip(paths, infos, strict=True)
        return [pafs.FileInfo(p, t, mtime_ns=m, size=s) for p, (t, s, m) in pairs]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base, rel = selector.base_dir, self.rel(selector.base_dir)
        recursive, missing_ok = selector.recursive, selector.allow_not_found
        found = self.read(
            "list",
            lambda link, root: link.call(
                NodeMetadata.fs_list, root, on_copy(root, rel), recursive, missing_ok
            ),
        )
        prefix = base.rstrip("/") + "/" if base.strip("/") else base[:1]
        return [pafs.FileInfo(prefix + r, t, mtime_ns=m, size=s) for r, t, s, m in found]

    def create_dir(self, path: str, recursive: bool) -> None:
        rel = self.rel(path)
        self.change(
            [path],
            lambda link, root, op: link.submit(
                NodeMetadata.fs_create_dir, root, on_copy(root, rel), recursive, op
            ),
        )

    def delete_dir(self, path: str) -> None:
        rel = self.rel(path)
        self.change(
            [path],
            lambda link, root, op: link.submit(
                NodeMetadata.fs_delete_dir, root, on_copy(root, rel), op
            ),
        )

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        rel = self.rel(path)
        self.change(
            [path],
            lambda link, root, op: link.submit(
                NodeMetadata.fs_delete_dir_contents, root, on_copy(root, rel), missing_dir_ok, op
            ),
        )

    def delete_root_dir_contents(self) -> None:
        self.delete_dir_contents(self.root)

    def delete_file(self, path: str) -> None:
        rel = self.rel(path)
        self.change(
            [path],
            lambda link, root, op: link.submit(
                NodeMetadata.fs_delete_file, root, on_copy(root, rel), op
            ),
        )

    def move(self, src: str, dest: str) -> None:
        a_rel, b_rel = self.rel(src), self.rel(dest)
        self.change(
            [src, dest],
            lambda link, root, op: link.submit(
                NodeMetadata.fs_move, root, on_copy(root, a_rel), on_copy(root, b_rel), op
            ),
        )

    def copy_file(self, src: str, dest: str) -> None:
        # The source too: a commit of it between two copies' copies would leave
        # them with different destinations.
        a_rel, b_rel = self.rel(src), self.rel(dest)
        self.change(
            [src, dest],
            lambda link, root, op: link.submit(
                NodeFiles.fs_copy_file, root, on_copy(root, a_rel), on_copy(root, b_rel), op
            ),
        )

    # -- file bodies -------------------------------------------------------------------
    def _open_input(self, path: str) -> pa.NativeFile:
        rel = self.rel(path)
        copies, fresh, _, _ = self.ensure()
        here = this_node_id() if ray.is_initialized() else ""
        order = replica_set.read_order(self.key, copies, fresh, here)
        if order and order[0][0] == here:
            try:
                return open_native(order[0][1], on_copy(order[0][1], rel))
            except FileNotFoundError:
                if self.durable is None:
                    raise
        if self.durable is not None:
            (ftype, size, _), held, record = self.read(
                "answer",
                lambda link, root: link.call(NodeDurable.durable_locate, root, on_copy(root, rel)),
            )
            if not held and ftype == pafs.FileType.File and record is not None:
                reader = open_verified(self.durable, rel, record)  # the durable tier's alone
                return pa.PythonFile(buffered(reader, self.config.chunk_bytes), mode="r")
        else:
            [(ftype, size, _)] = self.read(
                "answer",
                lambda link, root: link.call(NodeMetadata.fs_info, root, [on_copy(root, rel)]),
            )
        if ftype == pafs.FileType.NotFound:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        if ftype != pafs.FileType.File or size is None:
            raise IsADirectoryError(errno.EISDIR, "Cannot open for reading", path)
        cb = read_chunk_bytes(self.config)
        chunks = lambda first, last: self.chunks(rel, size, first, last)  # noqa: E731
        return pa.PythonFile(ChunkFileReader(path, size, 0, cb, chunks), mode="r")

    def chunks(
        self, rel: str, size: int, first: int, last: int
    ) -> Iterator[tuple[int, memoryview]]:
        """The file's chunks from ``first``, from one fresh copy; when that copy is
        lost mid-read, from the next, resuming at the chunk not yet handed out."""
        tried: set[str] = set()
        while True:
            copies, fresh, _, _ = self.ensure()
            order = [c for c in replica_set.read_order(self.key, copies, fresh, this_node_id())]
            order = [c for c in order if c[0] not in tried]
            if not order:
                raise ConnectionError(
                    f"no live complete copy of {rel!r} in node storage {self.root!r} is left "
                    f"to read from (lost: {', '.join(n[:12] for n in tried)})"
                )
            node, root = order[0]
            try:
                link, where = self.link_to(node, root), on_copy(root, rel)
                for index, view in _chunks(link, where, size, first, last):
                    yield index, view
                    first = index + 1
                return
            except Exception as e:
                if not is_lost(e):
                    raise
                tried.add(node)
                logger.warning(
                    "air-transfer: the copy of %s on node %s was lost mid-read (%s); "
                    "reading on from another copy",
                    rel,
                    node[:12],
                    type(e).__name__,
                )

    def _open_output(self, path: str, append: bool) -> pa.NativeFile:
        """``path`` staged on every copy the registry names, then written to each
        (``uploads.NodeUpload``, by the rules of ``ReplicaWrite``)."""
        staged, rules = self.stage_copies(path, append)
        # The copies write through the page cache (no direct_io), as they always did.
        writer = NodeUpload(Mode(Route.SEND), staged, self.config, path, rules=rules)
        return pa.PythonFile(writer, mode="w")

    def stage_copies(self, path: str, append: bool) -> tuple[list[Staged], ReplicaWrite]:
        """A staging file for ``path`` on every copy the registry names that can take
        it, and the rules its commit follows; the storage's error if it cannot."""
        rel = self.rel(path)
        self.ensure()
        copies, fresh = replica_set.call(RegistryCalls.targets, self.key)
        staged: list[Staged] = []
        outcomes: dict[str, BaseException | None] = {}
        calls = []
        for node, root in copies:
            link, where = self.link_to(node, root), on_copy(root, rel)
            try:
                call = link.submit(NodeFiles.fs_open_write, root, where, append)
                calls.append((node, link, where, call))
            except Exception as e:
                outcomes[node] = e
        for node, link, where, call in calls:
            try:
                staging, start, expect = link.wait(call)
                staged.append(Staged(node, link, where, staging, start, expect))
                outcomes[node] = None
            except Exception as e:
                outcomes[node] = e
        # The fresh copies' answer is the storage's (a syncing copy may lack the
        # directory yet: repair copies the file onto it after); a fresh copy that
        # answered otherwise is not staged, so its commit counts it stale.
        answer, missed = self.judge(outcomes, fresh)
        for s in staged:
            if answer is not None or s.node in missed:
                abort_copy(s)
        if answer is not None:
            raise answer
        staged = [s for s in staged if s.node not in missed]
        return staged, ReplicaWrite(self, rel, frozenset(fresh))
