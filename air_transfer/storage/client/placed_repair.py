"""Node storage with ``placement="writer"``: a placed file's holders made K live,
staying holders again after a holder's node is lost or Ray says it will go
(draining: downscaled, preempted). One mechanism for both callers: the explicit
``repair_holders(path)`` and the replica registry's background pass
(``keep_holders``, run in its actor whenever the live or draining nodes change:
``placed_keeper``).

For each placed file that names a holder lost or leaving, the blob is copied from
a live holder (a staying one first) to the next live staying nodes (in the ring
order ``placed_record.choose_holders`` uses), chunk by chunk from the source
holder's agent to the new holder's (bytes never pass through this process; each
chunk verified by ``fs_write``), committed there, and only then does every copy's
stub name the new holders: ``NodeFiles.fs_swap_stub``, a change through the replica
registry, which swaps only a stub still holding the record read (a file written,
moved or deleted meanwhile keeps its own; the new blobs are then deleted). So a
file names only holders that hold its bytes, whole, at every moment. A leaving
holder's blob, no longer named, is deleted while its node still answers. The files
of a leaving holder go first, the newest first, so that the latest checkpoint has
K copies before the node's deadline.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from air_transfer.cluster import _ray_core
from air_transfer.cluster.nodes import live_node_ids
from air_transfer.core.checksum import chunk_checksum
from air_transfer.storage.client.placed_record import Holder, PlacedRecord, placed_root
from air_transfer.storage.client.streams import AgentLink, read_chunk_bytes
from air_transfer.storage.node_api import Commit, NodeFiles, NodeMetadata, NodeReads
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

    def placed_under(self, path: str) -> list[tuple[str, PlacedRecord, float]]: ...

    def placed_link(self, node: str, root: str) -> AgentLink: ...

    def record_of(self, path: str) -> PlacedRecord | None: ...

    def rel(self, path: str) -> str: ...

    def change(self, paths: list[str], method: Callable[[AgentLink, str, str], Any]) -> None: ...

    def delete_blobs(self, holders: list[Holder], wheres: list[str]) -> None: ...


@dataclass(frozen=True)
class Nodes:
    """The cluster's nodes as a repair sees them: ``live``, and of those the
    ``leaving`` (draining) ones, which keep no file's bytes once it is repaired."""

    live: frozenset[str]
    leaving: frozenset[str]

    @classmethod
    def now(cls) -> Nodes:
        return cls(frozenset(live_node_ids()), frozenset(_ray_core.draining_nodes()))

    @property
    def staying(self) -> list[str]:
        return sorted(self.live - self.leaving)


@dataclass(frozen=True)
class Repair:
    """A placed file short of live staying holders: its handler, path, record, and
    the order it is repaired in (a leaving holder's files first, newest first)."""

    handler: PlacedHolders
    path: str
    record: PlacedRecord
    mtime: float
    leaving: bool

    @property
    def order(self) -> tuple[bool, float]:
        return (not self.leaving, -self.mtime)


def plan(handler: PlacedHolders, path: str, nodes: Nodes) -> list[Repair]:
    """The placed files at or under ``path`` to repair, in the order to repair them."""
    found = []
    for file, record, mtime in handler.placed_under(path):
        named = {n for n, _ in record.holders}
        if len(named) >= handler.replicas and named <= set(nodes.staying):
            continue
        found.append(Repair(handler, file, record, mtime, bool(named & nodes.leaving)))
    return sorted(found, key=lambda r: r.order)


def repair_holders(handler: PlacedHolders, path: str) -> list[str]:
    """Give every placed file at or under ``path`` ``handler.replicas`` live staying
    holders again; the files repaired. ConnectionError naming a file none of whose
    holders is live (its bytes are lost), or when too few nodes live to hold it;
    OSError (ESTALE) for a file written, moved or deleted meanwhile."""
    nodes = Nodes.now()
    repaired = []
    for repair in plan(handler, path, nodes):
        repair_one(repair, nodes)
        repaired.append(repair.path)
    return repaired


def keep_holders(repairs: Iterable[Repair], nodes: Nodes) -> list[str]:
    """Repair each of ``repairs`` (in their order), an error logged naming the file
    and why rather than raised: the files that could not be repaired."""
    failed = []
    for repair in sorted(repairs, key=lambda r: r.order):
        try:
            repair_one(repair, nodes)
        except Exception as e:
            failed.append(repair.path)
            logger.warning(
                "air-transfer: could not give placed file %s %d live holders off the "
                "nodes that will go (%s: %s); tried again later",
                repair.path,
                repair.handler.replicas,
                type(e).__name__,
                e,
            )
    return failed


def repair_one(repair: Repair, nodes: Nodes) -> None:
    """One file's blob copied to new staying holders, then its stub swapped to name
    them (only if it still holds the record read), then a leaving holder's blob
    deleted; the new blobs deleted if the swap fails."""
    handler, file, record = repair.handler, repair.path, repair.record
    staying = set(nodes.staying)
    kept = [h for h in record.holders if h[0] in staying]
    sources = kept + [h for h in record.holders if h[0] in nodes.live and h[0] not in staying]
    if not sources:
        raise ConnectionError(
            f"every holder of {file!r} is lost (placement='writer': "
            f"{', '.join(n[:12] for n, _ in record.holders)}); its bytes cannot be repaired"
        )
    added = _new_holders(handler, record, kept, sources[0], nodes.staying)
    try:
        _copy_blob(handler, record, sources[0], added)
        new = PlacedRecord(record.size, record.blob, (*kept, *added))
        _swap(handler, file, record.encode(), new.encode())
    except BaseException:
        _drop_unnamed(handler, file, record, added)
        raise
    gone = [h for h in record.holders if h[0] in nodes.live and h not in kept]
    handler.delete_blobs(gone, [record.where(h) for h in gone])  # leaving: unnamed now
    logger.info(
        "air-transfer: placed file %s is held by %s again",
        file,
        ", ".join(n[:12] for n, _ in new.holders),
    )


def _drop_unnamed(
    handler: PlacedHolders, path: str, record: PlacedRecord, holders: list[Holder]
) -> None:
    """Delete ``record``'s blob from each of ``holders`` that ``path`` does not name
    now: another repair of the file (the registry's, a user's) copies the blob to the
    same path on the same node, and the one whose swap lost must not delete the
    winner's. If the file's record cannot be read, they stay (garbage, not loss)."""
    try:
        now = handler.record_of(path)
    except Exception as e:
        logger.info("air-transfer: placed bytes of %s copied by a repair stay: %s", path, e)
        return
    named = set(now.holders) if now is not None and now.blob == record.blob else set()
    drop = [h for h in holders if h not in named]
    handler.delete_blobs(drop, [record.where(h) for h in drop])


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
    handler: PlacedHolders,
    record: PlacedRecord,
    kept: list[Holder],
    source: Holder,
    staying: list[str],
) -> list[Holder]:
    """The staying nodes after the first kept holder (or the source), in ring order,
    not holding it."""
    anchor = (kept[0] if kept else source)[0]
    ring = sorted(set(staying) | {anchor})
    at = ring.index(anchor)
    held = {n for n, _ in kept}
    order = [ring[(at + i) % len(ring)] for i in range(len(ring))]
    nodes = [n for n in order if n not in held and n in staying][: handler.replicas - len(kept)]
    if len(kept) + len(nodes) < handler.replicas:
        raise ConnectionError(
            f"placement='writer' with replicas={handler.replicas} needs that many live "
            f"nodes that stay to hold {record.blob!r}; {len(staying)} live and staying"
        )
    return [(n, placed_root(handler.replica_root, n)) for n in nodes]


def _copy_blob(
    handler: PlacedHolders, record: PlacedRecord, source: Holder, targets: list[Holder]
) -> None:
    """The blob copied from ``source`` to every one of ``targets``, committed there
    (a target that fails raises: the caller deletes what the others took)."""
    src = handler.placed_link(*source)
    where, cb = record.where(source), read_chunk_bytes(handler.config)
    for target in targets:
        link, dest = handler.placed_link(*target), record.where(target)
        link.call(NodeMetadata.fs_create_dir, link.root, dest.rsplit("/", 1)[0], True)
        staging, _, _ = link.call(NodeFiles.fs_open_write, link.root, dest, False)
        try:
            count = -(-record.size // cb)
            for first in range(0, count, 4):
                n = min(4, count - first)
                [pairs] = src.call(
                    NodeReads.file_chunks, src.root, where, record.size, cb, first, n, 0
                )
                writes = [
                    link.submit(
                        NodeFiles.fs_write,
                        link.root,
                        staging,
                        (first + i) * cb,
                        chunk,
                        cast(str, checksum),  # Ray resolves a ref passed as an argument
                    )
                    for i, (chunk, checksum) in enumerate(pairs)
                ]
                for w in writes:
                    link.wait(w)
        except BaseException:
            with contextlib.suppress(Exception):  # a target gone takes its staging file
                link.call(NodeFiles.fs_abort, link.root, staging)
            raise
        empty = chunk_checksum(b"")
        commit = Commit(dest, staging, record.size, b"", empty, record.size)
        link.call(NodeFiles.fs_commit, link.root, commit)
