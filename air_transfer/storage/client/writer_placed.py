"""Node storage with ``placement="writer"``: ``WriterPlacedHandler``, the pyarrow
handler of ``storage_filesystem(replicas=K, placement="writer")``.

The storage node and its K-1 copies are a replicated storage as any other
(``replicas.ReplicatedHandler``: names, directories, small files, every change
through the replica registry), except that a file of ``PLACE_MIN_BYTES`` or more
is kept there as a sparse stub of its size whose first bytes record where its bytes
are (``placed_record``): on the node of the process that wrote it and K-1 others,
each under its placed root (``placed_upload`` writes them). Listings and infos are
the copies' (the stub has the file's size); a read of a placed file goes to this
node's holder first, then to the others, failing over when one is lost; a delete,
or a write or move over a placed file, deletes the bytes it no longer names.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import posixpath
import shutil
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from air_transfer.cluster import _ray_core
from air_transfer.cluster.liveness import this_process
from air_transfer.cluster.nodes import NAMESPACE, live_node_ids, node_labels, this_node_id
from air_transfer.config import ZONE_LABEL
from air_transfer.core.reader import ChunkFileReader
from air_transfer.storage.client.placed_pending import Swept, marker
from air_transfer.storage.client.placed_reads import placed_chunks, read_order, sums_of
from air_transfer.storage.client.placed_repair import repair_holders
from air_transfer.storage.client.placed_sweep import sweep_placed
from air_transfer.storage.client.placed_upload import PlacedUpload, lost_holder
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.client.upload_copies import Staged, abort_copy
from air_transfer.storage.node_api import NodeFiles, NodeMetadata, NodeReads
from air_transfer.storage.placed_record import (
    PLACE_MIN_BYTES,
    RECORD_BYTES,
    SUMS_SUFFIX,
    Holder,
    PlacedRecord,
    choose_holders,
    decode,
    placed_root,
)
from air_transfer.storage.replica_wire import PLACED_PREFIX, Copy, on_copy

logger = logging.getLogger(__name__)


class WriterPlacedHandler(ReplicatedHandler):
    """A ``ReplicatedHandler`` whose large files' bytes stay where they were written
    (see the module); made by ``storage_filesystem(placement="writer")``, whose
    ``StorageConfig`` has checked its settings."""

    def __init__(self, *args: Any, failure_domain: str | None = ZONE_LABEL, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The node label that says a node's failure domain (``core.spread``).
        self.failure_domain = failure_domain
        self._placed_links: dict[Holder, AgentLink] = {}
        self._announced = False

    def __reduce__(self) -> tuple[Any, ...]:
        remake, args = super().__reduce__()
        return functools.partial(remake, failure_domain=self.failure_domain), args

    def ensure(self) -> tuple[list[Copy], list[str], list[str], int]:
        """``ReplicatedHandler.ensure``, and the storage made known as writer-placed to
        the registry's background pass (``placed_keeper``), with its failure domain."""
        found = super().ensure()
        if not self._announced:
            settings = json.dumps({"failure_domain": self.failure_domain}).encode()
            _ray_core.kv_put(NAMESPACE, PLACED_PREFIX + self.key, settings)
            self._announced = True
        return found

    def domains(self) -> dict[str, str]:
        """Each live node's failure domain, as its label says (see ``core.spread``)."""
        return node_labels(self.failure_domain)

    # -- writes ------------------------------------------------------------------------
    def _open_output(self, path: str, append: bool) -> pa.NativeFile:
        if append:
            raise OSError(
                errno.EOPNOTSUPP,
                "appending is not supported by node storage with placement='writer' "
                "(storage_filesystem(placement=...)): write the whole file",
                path,
            )
        # Refused at the open, as a write to one disk is, not at the close.
        target, parent = self.get_file_info([path, posixpath.dirname(self._path(path))])
        if parent.type != pafs.FileType.Directory:
            raise FileNotFoundError(errno.ENOENT, "No such directory to write into", path)
        if target.type == pafs.FileType.Directory:
            raise IsADirectoryError(errno.EISDIR, "Cannot write to a directory", path)
        return pa.PythonFile(PlacedUpload(self, path), mode="w")

    def open_inline(self, path: str) -> pa.NativeFile:
        """``path`` written whole to the storage node and its copies (a small file)."""
        return ReplicatedHandler._open_output(self, path, False)

    def stage_holders(self, blob: str) -> tuple[list[Holder], list[Staged]]:
        """A staging file for ``blob`` on each of the file's holders (this node first);
        every one, or the error of one that could not (the others' removed)."""
        live = sorted(live_node_ids() - set(_ray_core.draining_nodes()))
        nodes = choose_holders(this_node_id(), live, self.replicas, self.domains())
        holders = [(n, placed_root(self.replica_root, n)) for n in nodes]
        pending = marker(blob, this_process())  # declared before the blob exists
        calls = []
        for node, root in holders:
            link, where = self.placed_link(node, root), posixpath.join(root, blob)
            declared = posixpath.join(root, pending)
            made = link.submit(NodeMetadata.fs_create_dir, root, declared, True)
            calls.append((node, link, where, made))
        staged: list[Staged] = []
        try:
            for node, link, where, made in calls:
                try:
                    link.wait(made)
                    staging, start, expect = link.call(  # discarded if this process dies
                        NodeFiles.fs_open_write, link.root, where, False, this_process()
                    )
                except Exception as e:
                    raise lost_holder(where, node[:12], e) from e
                staged.append(Staged(node, link, where, staging, start, expect))
        except BaseException:
            for s in staged:
                abort_copy(s)
            self.end_pending(holders, blob)
            raise
        return holders, staged

    def end_pending(self, holders: list[Holder], blob: str) -> None:
        """Remove ``blob``'s pending markers (``placed_pending``) from ``holders``, once
        its stub is committed or its bytes deleted; one left (a holder gone) is the
        sweep's, after this process ends."""
        pending = marker(blob, this_process())
        markers = [(h, posixpath.join(h[1], pending)) for h in holders]
        self._delete_on(markers, NodeMetadata.fs_delete_dir)

    def placed_link(self, node: str, root: str) -> AgentLink:
        """The link to ``node``'s agent for its placed root ``root``."""
        link = self._placed_links.get((node, root))
        if link is None:
            link = self._placed_links[(node, root)] = AgentLink(node, root, self.config)
        return link

    # -- records -----------------------------------------------------------------------
    def record_of(self, path: str) -> PlacedRecord | None:
        """Where ``path``'s bytes are, if it is a placed file (None: its own bytes,
        or a directory); FileNotFoundError if there is none, ValueError if its record
        is not valid (``placed_record.decode``)."""
        rel = self.rel(path)
        try:
            found = self.read(
                "read",
                lambda link, root: link.call(
                    NodeReads.placed_head, root, on_copy(root, rel), RECORD_BYTES
                ),
            )
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
        if found is None:
            return None
        size, head = found
        return decode(head, size, path, self.replica_root)

    def records_under(self, path: str) -> list[PlacedRecord]:
        """The records of the placed files at or under ``path`` (none gone meanwhile)."""
        return [record for _, record, _ in self.placed_under(path)]

    def sweep_placed(self, dry_run: bool = False) -> list[Swept]:
        """Remove, from every live node, the blobs of this storage that no stub names
        and no live writer may still name (``placed_sweep``); what was judged."""
        return sweep_placed(self, dry_run)

    def repair_holders(self, path: str) -> list[str]:
        """Give every placed file at or under ``path`` K live holders that stay again,
        after a holder's node was lost or as Ray says it will go (``placed_repair``;
        the replica registry does it in the background too); the files repaired."""
        return repair_holders(self, path)

    def placed_under(self, path: str) -> list[tuple[str, PlacedRecord, float]]:
        """``(path, record, mtime)`` of each placed file at or under ``path`` (its
        stub's mtime, in seconds)."""
        try:
            infos = [self.get_file_info([path])[0]]
            if infos[0].type == pafs.FileType.Directory:
                infos = self.get_file_info_selector(pafs.FileSelector(path, recursive=True))
        except FileNotFoundError:
            return []
        records = []
        for info in infos:
            if info.type != pafs.FileType.File or (info.size or 0) < PLACE_MIN_BYTES:
                continue
            try:
                record = self.record_of(info.path)
            except FileNotFoundError:
                continue
            if record is not None:
                mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
                records.append((info.path, record, mtime))
        return records

    def delete_record(self, record: PlacedRecord) -> None:
        """Delete the bytes ``record`` names, no longer named by any file."""
        self.delete_blobs(list(record.holders), [record.where(h) for h in record.holders])

    def delete_blobs(self, holders: list[Holder], wheres: list[str]) -> None:
        """Delete blob ``wheres[i]`` on ``holders[i]``, and its checksums beside it; a
        holder gone keeps its (then unnamed) bytes, garbage rather than data
        (``sweep_placed``'s)."""
        gone = [
            (holder, path)
            for holder, where in zip(holders, wheres, strict=True)
            for path in (where, where + SUMS_SUFFIX)
        ]
        self._delete_on(gone, NodeMetadata.fs_delete_file)

    def _delete_on(
        self,
        targets: list[tuple[Holder, str]],
        method: Callable[[NodeMetadata, str, str, str], None],
    ) -> None:
        """``method`` (a delete) of each ``(holder, path)`` through the holder's agent,
        all at once; one that fails is logged and stays."""
        calls: list[tuple[AgentLink, Any]] = []
        for (node, root), where in targets:
            try:
                link = self.placed_link(node, root)
                calls.append((link, link.submit(method, root, where, "")))
            except Exception as e:
                logger.info("air-transfer: placed bytes %s on %s stay: %s", where, node[:12], e)
        for link, call in calls:
            try:
                link.wait(call)
            except FileNotFoundError:
                pass
            except Exception as e:
                logger.info("air-transfer: placed bytes on %s stay: %s", link.node_id[:12], e)

    # -- reads -------------------------------------------------------------------------
    def _open_input(self, path: str) -> pa.NativeFile:
        try:
            record = self.record_of(path)
        except FileNotFoundError:
            if self.durable is None:
                raise
            record = None  # perhaps the durable tier's alone (a run resumed elsewhere)
        if record is None:
            return ReplicatedHandler._open_input(self, path)
        order = read_order(record)
        sums = sums_of(self, path, record, order)
        chunks = lambda first, last: placed_chunks(self, path, record, sums, order, first, last)  # noqa: E731
        reader = ChunkFileReader(path, record.size, 0, sums.chunk_bytes, chunks)
        return pa.PythonFile(reader, mode="r")

    # -- changes that drop placed bytes ------------------------------------------------
    def delete_file(self, path: str) -> None:
        records = self.records_under(path)
        super().delete_file(path)
        for record in records:
            self.delete_record(record)

    def delete_dir(self, path: str) -> None:
        records = self.records_under(path)
        super().delete_dir(path)
        for record in records:
            self.delete_record(record)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        records = self.records_under(path)
        super().delete_dir_contents(path, missing_dir_ok)
        for record in records:
            self.delete_record(record)

    def move(self, src: str, dest: str) -> None:
        [info] = self.get_file_info([dest])
        replaced = self.records_under(dest) if info.type == pafs.FileType.File else []
        super().move(src, dest)
        for record in replaced:
            self.delete_record(record)

    def copy_file(self, src: str, dest: str) -> None:
        """Read and written again: two files never name the same placed bytes (a
        delete of one would take the other's)."""
        with self._open_input(src) as reader, self._open_output(dest, False) as writer:
            shutil.copyfileobj(reader, writer, self.config.chunk_bytes)
