"""Node storage with ``placement="writer"``: a placed file's holders made K good
ones again after a holder's node is lost or its bytes damaged (``repair_holders``).

Every live holder of each placed file under a path is checked against the file's
record (``placed_sums.holder_problem``: its checksums and every chunk of its blob).
Where fewer than K holders are live and good, the blob is copied from a good holder
to the next live nodes (in the ring order ``placed_record.choose_holders`` uses; a
damaged holder's node may be one, its bytes then replaced), chunk by chunk from the
source holder's agent to the new holder's (bytes never pass through this process;
each chunk checked by ``fs_write`` against the checksum the writer recorded), with
the checksums beside it, committed there, and only then does every copy's stub name the new
holders: ``NodeFiles.fs_swap_stub``, a change through the replica registry, which
swaps only a stub still holding the record read (a file written, moved or deleted
meanwhile keeps its own; the new blobs are then deleted). So a file names only
holders that hold its bytes, whole, at every moment.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from air_transfer.cluster import _ray_core
from air_transfer.cluster.nodes import live_node_ids
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.spread import spread
from air_transfer.errors import ChecksumError
from air_transfer.storage.client.placed_record import (
    Holder,
    PlacedRecord,
    PlacedSums,
    placed_root,
)
from air_transfer.storage.client.placed_sums import fetch_sums, holder_problem, write_sums
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.node_api import ChunkAt, Commit, NodeFiles, NodeMetadata, NodeReads
from air_transfer.storage.replica_wire import on_copy

if TYPE_CHECKING:
    from air_transfer.config import TransferConfig

logger = logging.getLogger(__name__)


class PlacedHolders(Protocol):
    """What a repair of holders asks of its storage (``writer_placed``'s handler)."""

    replicas: int
    replica_root: str

    @property
    def config(self) -> TransferConfig: ...

    def placed_under(self, path: str) -> list[tuple[str, PlacedRecord]]: ...

    def placed_link(self, node: str, root: str) -> AgentLink: ...

    def domains(self) -> dict[str, str]: ...

    def rel(self, path: str) -> str: ...

    def change(self, paths: list[str], method: Callable[[AgentLink, str, str], Any]) -> None: ...

    def delete_blobs(self, holders: list[Holder], wheres: list[str]) -> None: ...


def repair_holders(handler: PlacedHolders, path: str) -> list[str]:
    """Give every placed file at or under ``path`` ``handler.replicas`` live holders
    whose bytes match its record; the files repaired. ConnectionError naming a file
    none of whose holders is live (its bytes are lost), or when too few nodes live
    to hold it; ChecksumError naming one no live holder of which has good bytes."""
    live = sorted(live_node_ids() - set(_ray_core.draining_nodes()))
    repaired = []
    for file, record in handler.placed_under(path):
        kept, damaged = [], []
        for holder in (h for h in record.holders if h[0] in live):
            problem = holder_problem(handler, file, record, holder)
            if problem is None:
                kept.append(holder)
            else:
                logger.warning(
                    "air-transfer: the holder of %s on node %s is replaced: %s",
                    file,
                    holder[0][:12],
                    problem,
                )
                damaged.append(holder)
        if len(kept) == len(record.holders) >= handler.replicas:
            continue
        if not kept:
            holders = ", ".join(n[:12] for n, _ in record.holders)
            if damaged:
                raise ChecksumError(
                    errno.EIO,
                    f"no live holder of {file!r} has bytes that match its record "
                    f"(placement='writer': {holders}); it cannot be repaired",
                    file,
                )
            raise ConnectionError(
                f"every holder of {file!r} is lost (placement='writer': "
                f"{holders}); its bytes cannot be repaired"
            )
        sums = fetch_sums(handler, file, record, kept[0])
        added = _new_holders(handler, record, kept, live)
        _copy_blob(handler, record, sums, kept[0], added)
        new = PlacedRecord(record.size, record.blob, (*kept, *added), record.sums)
        try:
            _swap(handler, file, record.encode(), new.encode())
        except BaseException:
            handler.delete_blobs(added, [new.where(h) for h in added])
            raise
        gone = [h for h in damaged if h not in added]  # bytes no record names now
        handler.delete_blobs(gone, [record.where(h) for h in gone])
        repaired.append(file)
    return repaired


def _swap(handler: PlacedHolders, path: str, old: bytes, new: bytes) -> None:
    """Every copy's stub ``path`` given record ``new`` if it still holds ``old``."""
    rel = handler.rel(path)
    handler.change(
        [path],
        lambda link, root, op: link.submit(
            NodeFiles.fs_swap_stub, root, on_copy(root, rel), old, new, op
        ),
    )


def _new_holders(
    handler: PlacedHolders, record: PlacedRecord, kept: list[Holder], live: list[str]
) -> list[Holder]:
    """Live nodes after the first kept holder on the ring of failure domains
    (``core.spread``), a domain no kept holder is in first."""
    try:
        nodes = spread([n for n, _ in kept], live, handler.replicas, handler.domains())
    except ValueError:
        raise ConnectionError(
            f"placement='writer' with replicas={handler.replicas} needs that many live "
            f"nodes to hold {record.blob!r}; {len(set(live))} live"
        ) from None
    return [(n, placed_root(handler.replica_root, n)) for n in nodes[len(kept) :]]


def _copy_blob(
    handler: PlacedHolders,
    record: PlacedRecord,
    sums: PlacedSums,
    source: Holder,
    targets: list[Holder],
) -> None:
    """The blob copied from ``source`` to every one of ``targets``, each chunk checked
    there against ``sums``, committed there with ``sums`` beside it (a target that
    fails: what the others took is deleted, and the error raised)."""
    src = handler.placed_link(*source)
    where, cb = record.where(source), sums.chunk_bytes
    done: list[Holder] = []
    try:
        for target in targets:
            link, dest = handler.placed_link(*target), record.where(target)
            link.call(NodeMetadata.fs_create_dir, link.root, dest.rsplit("/", 1)[0], True)
            staging, _, _ = link.call(NodeFiles.fs_open_write, link.root, dest, False)
            count = -(-record.size // cb)
            for first in range(0, count, 4):
                n = min(4, count - first)
                [pairs] = src.call(
                    NodeReads.file_chunks, src.root, where, record.size, cb, first, n, 0
                )
                writes = [  # checked against the writer's sums, not the source's
                    link.submit(
                        NodeFiles.fs_write,
                        link.root,
                        ChunkAt(staging, (first + i) * cb),
                        chunk,
                        sum_,
                    )
                    for i, ((chunk, _), sum_) in enumerate(
                        zip(pairs, sums.sums[first : first + n], strict=True)
                    )
                ]
                for w in writes:
                    link.wait(w)
            empty = chunk_checksum(b"")
            commit = Commit(dest, staging, record.size, b"", empty, record.size)
            link.call(NodeFiles.fs_commit, link.root, commit)
            done.append(target)
        write_sums(handler, record, sums, targets)
    except BaseException:
        handler.delete_blobs(done, [record.where(h) for h in done])
        raise
