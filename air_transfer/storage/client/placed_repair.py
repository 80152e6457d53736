"""Node storage with ``placement="writer"``: a placed file's holders made K live,
staying, good ones again after a holder's node is lost, Ray says it will go
(draining: downscaled, preempted) or its bytes are damaged. One mechanism for both
callers: the explicit ``repair_holders(path)``, which also checks every holder's
bytes, and the replica registry's background pass (``keep_holders``, run in its
actor whenever the live or draining nodes change: ``placed_keeper``).

Each live holder of a file to repair is checked against the file's record
(``placed_sums.holder_problem``: its checksums and every chunk of its blob). The
blob is copied from a good holder (a staying one first) to the next live staying
nodes on the ring of failure domains (``core.spread``; a damaged holder's node may
be one, its bytes then replaced), chunk by chunk from the source holder's agent to
the new holder's (bytes never pass through this process; each chunk checked by
``fs_write`` against the checksum the writer recorded), with the checksums beside
it, committed there, and only then does every copy's stub name the new holders:
``NodeFiles.fs_swap_stub``, a change through the replica registry, which swaps only
a stub still holding the record read (a file written, moved or deleted meanwhile
keeps its own; the new blobs are then deleted). So a file names only holders that
hold its bytes, whole, at every moment. A leaving or damaged holder's blob, no
longer named, is deleted while its node still answers. The files of a leaving
holder go first, the newest first, so that the latest checkpoint has K copies
before the node's deadline. Repairs of one file are made one at a time, in any
processes on any nodes: each holds the replica registry's claim on the file's blob
(``placed_claim``) and reads the file's record again once it has it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace

from air_transfer.cluster import _ray_core
from air_transfer.cluster.nodes import live_node_ids
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.spread import spread
from air_transfer.errors import ChecksumError
from air_transfer.storage.client.placed_claim import claimed
from air_transfer.storage.client.placed_storage import PlacedStorage
from air_transfer.storage.client.placed_sums import fetch_sums, holder_problem, write_sums
from air_transfer.storage.node_api import ChunkAt, Commit, NodeFiles, NodeMetadata, NodeReads
from air_transfer.storage.placed_record import (
    Holder,
    PlacedRecord,
    PlacedSums,
    placed_root,
)
from air_transfer.storage.replica_wire import on_copy

logger = logging.getLogger(__name__)


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
    """A placed file to repair: its handler, path, record, and the order it is
    repaired in (a leaving holder's files first, newest first)."""

    handler: PlacedStorage
    path: str
    record: PlacedRecord
    mtime: float
    leaving: bool

    @property
    def order(self) -> tuple[bool, float]:
        return (not self.leaving, -self.mtime)


def plan(handler: PlacedStorage, path: str, nodes: Nodes, every: bool = False) -> list[Repair]:
    """The placed files at or under ``path`` short of K staying holders (``every``:
    all of them, their bytes to be checked), in the order to repair them."""
    found = []
    for file, record, mtime in handler.placed_under(path):
        named = {n for n, _ in record.holders}
        short = len(named) < handler.replicas or not named <= set(nodes.staying)
        if short or every:
            found.append(Repair(handler, file, record, mtime, bool(named & nodes.leaving)))
    return sorted(found, key=lambda r: r.order)


def repair_holders(handler: PlacedStorage, path: str) -> list[str]:
    """Give every placed file at or under ``path`` ``handler.replicas`` live staying
    holders whose bytes match its record; the files repaired. ConnectionError naming
    a file none of whose holders is live (its bytes are lost), or when too few nodes
    live to hold it; ChecksumError naming one no live holder of which has good bytes;
    OSError (ESTALE) for a file written, moved or deleted while it is repaired (one
    changed before is left as it is now)."""
    nodes = Nodes.now()
    return [r.path for r in plan(handler, path, nodes, every=True) if repair_one(r, nodes)]


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


def repair_one(repair: Repair, nodes: Nodes) -> bool:
    """``repair`` made while it holds the replica registry's claim on the file's blob
    (``placed_claim``: no other repair of it runs meanwhile), from the file's record
    as it is then (another repair may have just changed it). False: nothing to do
    (K staying holders, all good), or the file was written, moved or deleted since
    it was listed (its new version is the writer's; a moved one, the next pass's)."""
    with claimed(repair.handler.key, repair.record.blob):
        try:
            now = repair.handler.record_of(repair.path)
        except FileNotFoundError:
            return False
        if now is None or now.blob != repair.record.blob:
            return False
        return _repair_claimed(replace(repair, record=now), nodes)


def _repair_claimed(repair: Repair, nodes: Nodes) -> bool:
    """One file's blob copied from a good holder to new staying holders, then its
    stub swapped to name them (only if it still holds the record read), then the
    leaving and damaged holders' blobs deleted; the new blobs deleted if the swap
    fails."""
    handler, file, record = repair.handler, repair.path, repair.record
    kept, leaving, damaged = _judge(handler, file, record, nodes)
    if len(kept) == len(record.holders) >= handler.replicas:
        return False
    sources = kept + leaving
    if not sources:
        holders = ", ".join(n[:12] for n, _ in record.holders)
        if damaged:
            raise ChecksumError(
                errno.EIO,
                f"no live holder of {file!r} has bytes that match its record "
                f"(placement='writer': {holders}); it cannot be repaired",
                file,
            )
        raise ConnectionError(
            f"every holder of {file!r} is lost (placement='writer': {holders}); "
            "its bytes cannot be repaired"
        )
    sums = fetch_sums(handler, file, record, sources[0])
    added = _new_holders(handler, record, kept, sources[0], nodes.staying)
    new = PlacedRecord(record.size, record.blob, (*kept, *added), record.sums)
    try:
        _copy_blob(handler, record, sums, sources[0], added)
        _swap(handler, file, record.encode(), new.encode())
    except BaseException:
        _drop_unnamed(handler, file, record, added)
        raise
    gone = [h for h in (*leaving, *damaged) if h not in added]  # unnamed now
    handler.delete_blobs(gone, [record.where(h) for h in gone])
    logger.info(
        "air-transfer: placed file %s is held by %s again",
        file,
        ", ".join(n[:12] for n, _ in new.holders),
    )
    return True


def _judge(
    handler: PlacedStorage, file: str, record: PlacedRecord, nodes: Nodes
) -> tuple[list[Holder], list[Holder], list[Holder]]:
    """``record``'s live holders whose bytes match it, staying and leaving, and
    those whose bytes do not (each named in a warning)."""
    kept: list[Holder] = []
    leaving: list[Holder] = []
    damaged: list[Holder] = []
    for holder in (h for h in record.holders if h[0] in nodes.live):
        problem = holder_problem(handler, file, record, holder)
        if problem is not None:
            logger.warning(
                "air-transfer: the holder of %s on node %s is replaced: %s",
                file,
                holder[0][:12],
                problem,
            )
            damaged.append(holder)
        else:
            (leaving if holder[0] in nodes.leaving else kept).append(holder)
    return kept, leaving, damaged


def _drop_unnamed(
    handler: PlacedStorage, path: str, record: PlacedRecord, holders: list[Holder]
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


def _swap(handler: PlacedStorage, path: str, old: bytes, new: bytes) -> None:
    """Every copy's stub ``path`` given record ``new`` if it still holds ``old``."""
    rel = handler.rel(path)
    handler.change(
        [path],
        lambda link, root, op: link.submit(
            NodeFiles.fs_swap_stub, root, on_copy(root, rel), old, new, op
        ),
    )


def _new_holders(
    handler: PlacedStorage,
    record: PlacedRecord,
    kept: list[Holder],
    source: Holder,
    staying: list[str],
) -> list[Holder]:
    """Staying nodes after the first kept holder (or the source) on the ring of
    failure domains (``core.spread``), a domain no kept holder is in first."""
    first = [n for n, _ in kept] or [source[0]]
    count = handler.replicas + (0 if kept else 1)  # a leaving source holds no copy
    try:
        nodes = spread(first, [n for n in staying if n not in first], count, handler.domains())
    except ValueError:
        raise ConnectionError(
            f"placement='writer' with replicas={handler.replicas} needs that many live "
            f"nodes that stay to hold {record.blob!r}; {len(staying)} live and staying"
        ) from None
    return [(n, placed_root(handler.replica_root, n)) for n in nodes[len(first) :]]


def _copy_blob(
    handler: PlacedStorage,
    record: PlacedRecord,
    sums: PlacedSums,
    source: Holder,
    targets: list[Holder],
) -> None:
    """The blob copied from ``source`` to every one of ``targets``, each chunk checked
    there against ``sums``, committed there with ``sums`` beside it (a target that
    fails raises: the caller deletes what the others took)."""
    src = handler.placed_link(*source)
    where, cb = record.where(source), sums.chunk_bytes
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
        except BaseException:
            with contextlib.suppress(Exception):  # a target gone takes its staging file
                link.call(NodeFiles.fs_abort, link.root, staging)
            raise
        empty = chunk_checksum(b"")
        commit = Commit(dest, staging, record.size, b"", empty, record.size)
        link.call(NodeFiles.fs_commit, link.root, commit)
    write_sums(handler, record, sums, targets)
