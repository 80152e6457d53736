"""``ChunkPacker``: the node agent's packing step. A chunk of one large local file is
handed out as a view of the file mapped under a read lease (``core.mapped``): Ray's
copy of the task's return value into the object store is then its only copy. Other
chunks (several files, small, remote, lease refused) are read into one reusable
buffer per thread. Every chunk is checksummed and proven against its plan's stamps."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar

import numpy as np

from air_transfer.core import proven_read
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.knobs import KNOBS
from air_transfer.core.mapped import FileReadLease, lease
from air_transfer.core.plan import ChunkPlan, Span
from air_transfer.core.proven_read import FileCursor, SourceFile, check_stat, fill_chunk
from air_transfer.core.scan import Source, Stamp

T = TypeVar("T")

#: Called once a mapped view's bytes were used (hashed, stored): raises
#: SourceChangedError unless they were the version scanned (``Lease.prove``).
Proof = Callable[[], None]

#: Test-only seam, None in production: called as ``hook(path, span)`` once a chunk is
#: mapped under its lease and before it is hashed (``_after_span_read`` runs before
#: the lease is taken, so that a rewrite from a hook need not wait for it).
_while_mapped: Callable[[str, Span], None] | None = None


class ChunkPacker:
    """Packs chunks from their plans (a few per call, from any number of threads).

    For the node agent, which packs every chunk of every transfer on its node as one
    task each. A chunk read rather than mapped goes into a reusable buffer per thread:
    a fresh chunk-sized buffer per task would fault in new pages every time (~8k page
    faults per 32 MiB chunk). The views ``pack`` returns stay valid until the same
    thread packs again; Ray stores a task's return value in the object store in the
    thread that ran the task, before that thread runs another, so an actor method may
    return them directly. Memory: one buffer per packing thread, only as large as the
    read chunks of one call; a mapped chunk is page cache, not private memory.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def _buffer(self, length: int) -> np.ndarray:
        buffer: np.ndarray | None = getattr(self._local, "buffer", None)
        if buffer is None or len(buffer) < length:
            buffer = self._local.buffer = np.empty(length, dtype=np.uint8)
        return buffer[:length]

    def pack(
        self, source: Source, plans: Sequence[ChunkPlan]
    ) -> tuple[list[np.ndarray], list[str]]:
        """The chunks of ``plans`` of ``source`` and their checksums, each proven
        against its plan's stamps (SourceChangedError otherwise); they stay valid
        together until this thread packs again."""
        chunks, checksums = self._pack(source, plans, hash_mapped=True)
        return chunks, [c for c in checksums if c is not None]

    def pack_unhashed(
        self, source: Source, plans: Sequence[ChunkPlan]
    ) -> tuple[list[np.ndarray], list[str | None]]:
        """As ``pack``, but a chunk mapped under its lease is not hashed (its checksum
        None: to be taken of the stored copy; the lease, held by the view until Ray
        has copied it, keeps the file as checked before mapping)."""
        return self._pack(source, plans, hash_mapped=False)

    def _pack(
        self, source: Source, plans: Sequence[ChunkPlan], hash_mapped: bool
    ) -> tuple[list[np.ndarray], list[str | None]]:
        chunks: list[np.ndarray] = []
        checksums: list[str | None] = []
        with FileCursor(source) as cursor, _FileReadLeases(source) as leases:
            mapped = [leases.map(cursor, plan, hash_mapped) for plan in plans]
            read = sum(plan.length for plan, m in zip(plans, mapped, strict=True) if m is None)
            buffer = self._buffer(read)
            offset = 0
            for plan, found in zip(plans, mapped, strict=True):
                if found is not None:
                    chunk, checksum = found
                else:
                    chunk = buffer[offset : offset + plan.length]
                    fill_chunk(source, plan, memoryview(chunk), cursor)
                    checksum = chunk_checksum(chunk)
                    offset += plan.length
                chunks.append(chunk)
                checksums.append(checksum)
        return chunks, checksums

    def store_each(
        self, source: Source, plans: Sequence[ChunkPlan], store: Callable[[np.ndarray], T]
    ) -> list[tuple[T, str | None]]:
        """Each chunk of ``plans`` handed to ``store`` (which copies it, e.g. into the
        object store) and what it returned, in order, with the chunk's checksum, or
        None for a chunk stored straight from its mapping unhashed: its lease held
        while ``store`` copies it and its stamps checked after (SourceChangedError),
        so the copy is of the scanned version and its hash is to be taken of the
        copy. A chunk that cannot be mapped is read, hashed and proven as ``pack``
        does it."""
        stored: list[tuple[T, str | None]] = []
        for plan in plans:
            with FileCursor(source) as cursor, _FileReadLeases(source) as leases:
                found = leases.map_unhashed(cursor, plan)
                if found is None:
                    (chunk,), (checksum,) = self.pack(source, [plan])
                    stored.append((store(chunk), checksum))
                    continue
                view, prove = found
                del found
                stored.append((store(view), None))
                del view  # the mapping's last view: the lease goes with the group
                prove()
        return stored

    def pack_stream(
        self, source: Source, plans: Sequence[ChunkPlan]
    ) -> tuple[np.ndarray, list[str]]:
        """The chunks of ``plans`` end to end as one array (``inline``'s one object)
        and their checksums: a mapped view where they are all of one local file,
        else read into a fresh array."""
        paths = {path for plan in plans for path, _ in plan.files}
        if len(paths) == 1 and plans:
            (path, stamp), first = plans[0].files[0], plans[0].spans[0]
            length = sum(plan.length for plan in plans)
            span = Span(first.file_index, first.file_offset, length, 0)
            with FileCursor(source) as cursor, _FileReadLeases(source) as leases:
                mapped = leases.map_range(cursor, path, stamp, span, [p.length for p in plans])
            if mapped is not None:
                return mapped
        stream = np.empty(sum(plan.length for plan in plans), dtype=np.uint8)
        checksums = []
        offset = 0
        with FileCursor(source) as cursor:
            for plan in plans:
                view = memoryview(stream)[offset : offset + plan.length]
                fill_chunk(source, plan, view, cursor)
                checksums.append(chunk_checksum(view))
                offset += plan.length
        return stream, checksums

    def checksums(self, source: Source, plans: Sequence[ChunkPlan]) -> list[str]:
        """Only the checksums of ``plans``' chunks (``streamed`` reads the bytes again
        at transfer time): of the mapped file where it can be, else read through one
        chunk buffer."""
        return [self.pack(source, [plan])[1][0] for plan in plans]


class _FileReadLeases:
    """The read leases of one packing call, one per file (None: refused). Each is held
    by the call until it ends and by every view mapped under it until Ray has copied
    it, or until another process wants the file: its views are then made private
    copies (``core.mapped``). A truncate never makes an access SIGBUS."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.leases: dict[str, FileReadLease | None] = {}

    def map(
        self, cursor: FileCursor, plan: ChunkPlan, hashed: bool = True
    ) -> tuple[np.ndarray, str | None] | None:
        """Chunk ``plan`` as a mapped view and its checksum, proven against its stamp
        (without ``hashed``: checked before mapping, None for the checksum); None
        where it is to be read instead."""
        if not hashed:
            found = self.map_unhashed(cursor, plan)
            return None if found is None else (found[0], None)
        if len(plan.spans) != 1:
            return None
        (span,), ((path, stamp),) = plan.spans, plan.files
        mapped = self.map_range(cursor, path, stamp, span, [span.length])
        return None if mapped is None else (mapped[0], mapped[1][0])

    def map_unhashed(self, cursor: FileCursor, plan: ChunkPlan) -> tuple[np.ndarray, Proof] | None:
        """Chunk ``plan`` as a mapped view under the lease, its file checked against
        its stamp before mapping, and the proof the caller runs once it has copied
        the view. None where it is to be read instead."""
        if len(plan.spans) != 1:
            return None
        (span,), ((path, stamp),) = plan.spans, plan.files
        return self._view(cursor, path, stamp, span)

    def map_range(
        self, cursor: FileCursor, path: str, stamp: Stamp, span: Span, pieces: list[int]
    ) -> tuple[np.ndarray, list[str]] | None:
        """``span`` of file ``path`` as a mapped view and the checksums of its
        ``pieces`` (lengths, end to end): the lease is taken, then the file checked,
        mapped, hashed and checked again. None where it is to be read instead."""
        found = self._view(cursor, path, stamp, span)
        if found is None:
            return None
        view, prove = found
        checksums, offset = [], 0
        for length in pieces:
            checksums.append(chunk_checksum(view[offset : offset + length]))
            offset += length
        prove()
        return view, checksums

    def _view(
        self, cursor: FileCursor, path: str, stamp: Stamp, span: Span
    ) -> tuple[np.ndarray, Proof] | None:
        """``span`` of ``path`` mapped under the lease, the file checked first, and
        the proof to run once its bytes were used."""
        if not self.source.is_local or span.length < KNOBS.mapped_chunk_min_bytes:
            return None
        file = cursor.open(path, stamp)
        hook = proven_read._after_span_read
        if hook is not None:  # before the lease: a rewrite here must not wait for it
            hook(file.where, span)
        held = self._lease(path, file)
        if held is None:
            return None
        file.check()
        try:
            view = held.view(span.file_offset, span.length)
        except OSError:  # a filesystem that cannot map files (ENODEV): read it
            return None
        if view is None:  # handed back on a break already: read it
            return None
        mapped = _while_mapped
        if mapped is not None:
            mapped(file.where, span)
        return view, partial(held.prove, file.check)

    def _lease(self, path: str, file: SourceFile) -> FileReadLease | None:
        if path not in self.leases:
            proof = partial(check_stat, file.where, file.stamp, stored=file.stored)
            self.leases[path] = lease(file.fd, proof)
        return self.leases[path]

    def __enter__(self) -> _FileReadLeases:
        return self

    def __exit__(self, *exc: object) -> None:
        for held in self.leases.values():
            if held is not None:
                held.drop()
