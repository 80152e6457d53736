"""One file written to node storage with ``placement="writer"``: ``PlacedUpload``.

Its first ``PLACE_MIN_BYTES`` are held here: a file that ends before them is
written whole to the storage node and its copies, as any replicated file. A larger
one is staged on its holders (``placed_record.choose_holders``: this node first),
each chunk put in the object store once and written by every holder's agent from
it (``uploads.NodeUpload``), each chunk's checksum noted as it passes
(``placed_record.ChunkSummer``). At close every holder commits it under a name no
other write uses (``HolderCommit``) and the checksums beside it
(``placed_sums.write_sums``), and only then is its stub, whose record names them
and pins the checksums, committed on the storage node and its copies, within the
replica registry's rules (``replica_write.ReplicaWrite``). Any holder failing
fails the write, and what the others took is deleted: a file is visible only once
every holder has its bytes.

With ``incremental``, each chunk is offered to every holder by its checksum
(``Route.OFFER``, as an incremental DCP stream is offered to the storage node):
a holder's agent that finds it in a blob it holds under its placed root (its
``chunk_index``: every blob is committed indexed) copies it from there, read and
hashed now, and only a holder lacking it, or whose stored copy no longer matches
(deleted, damaged), fetches it over the network; a blob whose every byte a held
blob proves to have becomes a hard link of it. The rest is as above.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from air_transfer.core.checksum import chunk_checksum
from air_transfer.storage.client.placed_storage import PlacedStorage
from air_transfer.storage.client.placed_sums import write_sums
from air_transfer.storage.client.replica_set import is_lost
from air_transfer.storage.client.streams import read_chunk_bytes
from air_transfer.storage.client.upload_copies import Mode, Route, Staged, abort_copy
from air_transfer.storage.client.uploads import NodeUpload, WriteStream
from air_transfer.storage.node_api import ChunkAt, Commit, NodeFiles, NodeReads
from air_transfer.storage.placed_record import (
    PLACE_MIN_BYTES,
    RECORD_BYTES,
    ChunkSummer,
    Holder,
    PlacedRecord,
    blob_path,
    decode,
)

if TYPE_CHECKING:
    from collections.abc import Buffer


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HolderCommit:
    """The rules of a placed file's write (``upload_copies.CopyRules``): every holder
    or none. No holder may be lost; at the commit each holder publishes its blob, and
    when one fails the others' are deleted and the write raises."""

    handler: PlacedStorage
    name: str

    def can_lose(self, copy: Staged, error: Exception) -> bool:
        return False

    def commit(self, copies: list[Staged], commit: Callable[[Staged, str], None]) -> None:
        done: list[Staged] = []
        failed: tuple[Staged, Exception] | None = None
        for s in copies:
            try:
                commit(s, "")
                done.append(s)
            except Exception as e:
                failed = failed or (s, e)
                abort_copy(s)
        copies.clear()
        if failed is not None:
            self.handler.delete_blobs([(s.node, s.link.root) for s in done], [s.path for s in done])
            raise lost_holder(self.name, failed[0].node[:12], failed[1])


def lost_holder(name: str, nodes: str, error: Exception) -> Exception:
    """The error of a placed write whose holder on ``nodes`` failed: ConnectionError
    naming them when one is gone, else the holder's own answer."""
    if not is_lost(error, reading=False):
        return error
    return ConnectionError(
        f"storage placement='writer': a holder of {name!r} (on node {nodes}) was lost "
        f"mid-write ({type(error).__name__}: {error}); nothing of this write was published "
        "(the previous version, if any, is still the file): write it again"
    )


class PlacedUpload(WriteStream):
    """``path`` written to ``handler`` (a ``writer_placed.WriterPlacedHandler``); ``close``
    publishes it whole, anything else (a failed write, dropped unclosed) leaves the
    file as it was."""

    def __init__(self, handler: PlacedStorage, path: str) -> None:
        super().__init__()
        self.handler, self.path = handler, path
        self.head = bytearray()  # held until the file is known to be placed
        self.upload: NodeUpload | None = None
        self.holders: list[Holder] = []
        self.blob = ""
        self.summer = ChunkSummer(read_chunk_bytes(handler.config))
        self.written = 0
        self.failed = False

    def write(self, data: Buffer) -> int:
        view = self._next_write(data, self.path)
        try:
            if self.upload is not None:
                self.upload.write(view)
                self.summer.update(view)
            else:
                self.head += view
                if len(self.head) >= PLACE_MIN_BYTES:
                    self._place()
        except Exception as e:
            self.failed = True
            raise self._explained(e) from e
        self.written += len(view)
        return len(view)

    def _place(self) -> None:
        """Stage the file on its holders and send them what was held."""
        handler = self.handler
        self.blob = blob_path(handler.key)
        self.holders, staged = handler.stage_holders(self.blob)
        # Incremental: each holder's agent is offered each chunk by checksum and copies
        # it from a blob it holds, read and proven now, else fetches it (see the module).
        mode = Mode(Route.OFFER, indexed=True) if handler.config.incremental else Mode(Route.SEND)
        rules = HolderCommit(handler, self.path)
        self.upload = NodeUpload(mode, staged, handler.config, self.path, rules=rules)
        head, self.head = self.head, bytearray()
        self.upload.write(head)
        self.summer.update(head)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self.failed:
                self._publish()
        except Exception as e:
            self.failed = True
            raise self._explained(e) from e
        finally:
            super().close()
            if self.failed and self.upload is not None:  # nothing of it is committed
                self.upload.abort(OSError(errno.EIO, "the placed write did not finish", self.path))
            if self.holders:  # its stub committed, or its blobs deleted: none pending
                self.handler.end_pending(self.holders, self.blob)

    def _publish(self) -> None:
        handler = self.handler
        if self.upload is None:  # small: whole on the storage node and its copies
            with handler.open_inline(self.path) as out:
                out.write(bytes(self.head))
            return
        self.upload.close()  # every holder commits, or none keeps it
        sums = self.summer.finish()
        record = PlacedRecord(self.written, self.blob, tuple(self.holders), sums.digest())
        try:
            write_sums(handler, record, sums)
            publish_stub(handler, self.path, record)
        except BaseException:
            handler.delete_blobs(list(record.holders), [record.where(h) for h in record.holders])
            raise

    def _explained(self, error: Exception) -> Exception:
        if isinstance(error, ConnectionError) and "placement='writer'" in str(error):
            return error
        nodes = " or ".join(n[:12] for n, _ in self.holders) or "?"
        return lost_holder(self.path, nodes, error)

    def __del__(self) -> None:
        if not self.closed:  # dropped unclosed: nothing is published
            self.failed = True
            with contextlib.suppress(Exception):
                self.close()


def publish_stub(handler: PlacedStorage, path: str, record: PlacedRecord) -> None:
    """Commit ``path``'s stub on the storage node and its copies: a sparse file of
    ``record.size`` bytes, the record in its first ones (so that listings and infos
    see the file's size), by the replica registry's rules; then delete the bytes of
    the placed version it replaced.

    What it replaces is read at the first copy's commit, within the registry's
    ``begin``/``end`` (one commit of a path at a time): of two writers racing on a
    path, the second to commit reads the first's record there and deletes its bytes,
    so a race's loser leaves none behind."""
    staged, rules = handler.stage_copies(path, append=False)
    header = record.encode()
    last = b"\x00"
    replaced: list[PlacedRecord | None] = []

    def commit(s: Staged, op: str) -> None:
        root, size = s.link.root, record.size
        if not replaced:
            replaced.append(_replaced(handler, s, path))
        s.link.call(NodeFiles.fs_write, root, ChunkAt(s.staging, 0), header, chunk_checksum(header))
        at_last = ChunkAt(s.staging, size - 1)
        s.link.call(NodeFiles.fs_write, root, at_last, last, chunk_checksum(last))
        done = Commit(
            s.path, s.staging, size, b"", chunk_checksum(b""), size, False, s.expect, True
        )
        s.link.call(NodeFiles.fs_commit, root, done, op)

    try:
        rules.commit(staged, commit)
    except BaseException:
        for s in staged:
            abort_copy(s)
        raise
    old = replaced[0] if replaced else None
    if old is not None and old.blob != record.blob:
        handler.delete_record(old)


def _replaced(handler: PlacedStorage, s: Staged, path: str) -> PlacedRecord | None:
    """The record of the placed file at ``s.path`` on copy ``s`` now (None: none,
    or a file of its own bytes; one not valid is left, logged, as its bytes are)."""
    try:
        found = s.link.call(NodeReads.placed_head, s.link.root, s.path, RECORD_BYTES)
    except FileNotFoundError:
        return None
    if found is None:
        return None
    try:
        return decode(found[1], found[0], path, handler.replica_root)
    except ValueError as e:
        logger.warning("air-transfer: the version %s replaces stays on its holders: %s", path, e)
        return None
