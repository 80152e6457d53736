"""Chunk objects of live transfers, reused by a later transfer of the same files
(``TransferConfig(reuse_chunks=True)``, ``owner="node"``): what a node agent packs
again is only what changed since.

The agent records every chunk of a transfer it holds a lease for (``cluster.transfer_leases``)
under what the chunk was packed from: for each span, the file's scan stamp (size,
mtime, ctime, inode, device, link count), its offset and length. A new transfer whose
chunk has the same spans of files whose scan stamps are equal takes that chunk's
object and checksum instead of packing it: the earlier packing proved the bytes are
the stamped version (read between two fstats equal to it, after the racy window),
and an equal stamp now proves the file still holds that version (any write since
would have moved its ctime), so the reused checksum is that of the current source.
Only local files are recorded (other filesystems have no ctime nor identity).

The records hold the refs, so a recorded chunk cannot be freed; a transfer's records
go when its lease does (``drop``), so they keep nothing alive longer than the lease
did, and a transfer released before the next one is simply not found (packed again).
A chunk whose packing already failed is never reused; one still being packed is
(its checksum ref then resolves, or fails, for both transfers alike).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Sequence

import ray

from air_transfer.cluster.refs import Checksum, ChecksumRef, ChunkRef, PendingChecksum
from air_transfer.core.plan import ChunkPlan
from air_transfer.core.scan import Source
from air_transfer.transfer.strategies.base import Packed, PackRequest

#: A chunk's object and its checksum (a str, or the ref of one still being packed).
Chunk = tuple[ChunkRef, PendingChecksum]
#: Submits packing of plans: their chunk refs and checksum refs, in order.
PackPlans = Callable[[Source, Iterable[ChunkPlan]], tuple[list[ChunkRef], list[ChecksumRef]]]


def chunk_key(plan: ChunkPlan) -> Hashable | None:
    """What chunk ``plan`` holds, as the bytes go: for each span, its file's stamp,
    offset, length and place in the chunk. None when a file has no local identity
    (then it is never matched)."""
    stamps = [stamp for _, stamp in plan.files]
    if any(s.ctime_ns is None or s.ino is None or s.dev is None for s in stamps):
        return None
    spans = tuple(
        (stamp, span.file_offset, span.length, span.chunk_offset)
        for span, stamp in zip(plan.spans, stamps, strict=True)
    )
    return plan.length, spans


class LiveChunks:
    """The chunks of the transfers an agent holds, by what they were packed from."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: chunk key -> transfer id -> that transfer's chunk.
        self._chunks: dict[Hashable, dict[str, Chunk]] = {}
        #: transfer id -> the keys it recorded.
        self._keys: dict[str, list[Hashable]] = {}
        self.chunks_reused = 0
        self.bytes_reused = 0

    def reuse(self, request: PackRequest, transfer_id: str, pack_rest: PackPlans) -> Packed:
        """Pack ``request`` (a ``CHUNKS`` layout) reusing every recorded chunk that
        holds the same bytes, ``pack_rest`` the rest, and record the result as
        ``transfer_id``'s. The payload and checksums of a ``CHUNKS`` ``Packed``."""
        plans = list(request.plans())
        keys = [chunk_key(plan) for plan in plans]
        found = _not_failed(self._find(keys))
        missing = [plan for plan in plans if plan.index not in found]
        data, sums = pack_rest(request.source, missing) if missing else ([], [])
        packed = iter(zip(data, sums, strict=True))
        chunks = [found[p.index] if p.index in found else next(packed) for p in plans]
        with self._lock:
            self.chunks_reused += len(found)
            self.bytes_reused += sum(plans[i].length for i in found)
            recorded = self._keys.setdefault(transfer_id, [])
            for key, chunk in zip(keys, chunks, strict=True):
                if key is not None:
                    self._chunks.setdefault(key, {})[transfer_id] = chunk
                    recorded.append(key)
        return Packed([d for d, _ in chunks], tuple(c for _, c in chunks))

    def drop(self, transfer_ids: Iterable[str]) -> None:
        """Forget the chunks of ``transfer_ids`` (their leases were released)."""
        with self._lock:
            for transfer_id in transfer_ids:
                for key in self._keys.pop(transfer_id, ()):
                    held = self._chunks.get(key)
                    if held is not None:
                        held.pop(transfer_id, None)
                        if not held:
                            del self._chunks[key]

    def held(self) -> int:
        """How many transfers' chunks are recorded."""
        with self._lock:
            return len(self._keys)

    def _find(self, keys: Sequence[Hashable | None]) -> dict[int, list[Chunk]]:
        """For each chunk index whose key is recorded, every recorded chunk for it."""
        with self._lock:
            return {
                i: list(self._chunks[key].values())
                for i, key in enumerate(keys)
                if key is not None and key in self._chunks
            }


def _not_failed(found: dict[int, list[Chunk]]) -> dict[int, Chunk]:
    """One candidate per index whose packing did not fail: a checksum already known
    (a str, or a ref that resolved to one) first, else one still being packed. A
    ref that resolved to an error (the packing failed) is never chosen."""
    pending = list(  # once each: the same chunk is recorded for every transfer reusing it
        dict.fromkeys(
            c for candidates in found.values() for _, c in candidates if not isinstance(c, str)
        )
    )
    ready: set[ChecksumRef] = set()
    if pending:
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=0, fetch_local=False)
        ready = set(done)
    resolved: dict[ChecksumRef, Checksum | None] = {}
    if ready:
        refs = list(ready)
        try:
            resolved = dict(zip(refs, ray.get(refs), strict=True))
        except Exception:  # a packing task itself died: find which, treat as failed
            for ref in refs:
                try:
                    resolved[ref] = ray.get(ref)
                except Exception:
                    resolved[ref] = None
    chosen: dict[int, Chunk] = {}
    for index, candidates in found.items():
        best: Chunk | None = None
        for data, checksum in candidates:
            if isinstance(checksum, str) or checksum in ready:
                value = checksum if isinstance(checksum, str) else resolved[checksum]
                if isinstance(value, str):  # packed: the best there is
                    best = (data, value)
                    break
            elif best is None:  # still being packed
                best = (data, checksum)
        if best is not None:
            chosen[index] = best
    return chosen
