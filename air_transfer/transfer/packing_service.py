"""What a node agent runs for packing: the chunks of a transfer's tasks filled into
the agent's buffers, their checksums, the completion a ``TransferFuture`` waits for,
and the ``streamed`` strategy's reads at transfer time. The agent hosts one
``PackingService``; callers name its methods (``AgentClient.call``), the packing
ones run in the agent's packing threads (``PACK_GROUP``).
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from air_transfer.cluster.fetch import fresh, get
from air_transfer.cluster.nodes import PACK_GROUP
from air_transfer.cluster.refs import PendingChecksum, Status
from air_transfer.cluster.rpc import in_group, served
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.entry import Entry
from air_transfer.core.packer import ChunkPacker
from air_transfer.core.plan import ChunkPlan, iter_chunk_spans
from air_transfer.core.proven_read import current_stamps
from air_transfer.core.readahead import read_chunks_ahead
from air_transfer.core.scan import Source, Stamp
from air_transfer.errors import SourceChangedError
from air_transfer.observe import metrics

#: How a packing task fills one object per chunk: ``(chunks, their statuses)``.
PackChunks = Callable[[Source, Sequence[ChunkPlan]], tuple[list[np.ndarray], Sequence[Status]]]


class PackingService:
    """Packing as the agent's tasks do it (one ``ChunkPacker`` buffer per thread):
    callers name its ``served`` methods; the packing ones run in its packing threads."""

    def __init__(self) -> None:
        self._packer = ChunkPacker()
        self._lock = threading.Lock()
        #: Source bytes put into chunk objects by ``pack_chunks`` and ``pack_stream``.
        self.bytes_packed = 0
        #: Bytes yielded by ``stream``: a ``streamed`` transfer's, once per reader.
        self.bytes_streamed = 0

    @served
    def stream(
        self,
        source: Source,
        files: Sequence[Entry],
        chunk_bytes: int,
        checksums: Sequence[PendingChecksum],
        start: int,
        stop: int | None,
        verify: bool = True,
        stamps: Sequence[Stamp] | None = None,
    ) -> Iterator[np.ndarray]:
        """Read chunks ``start``..``stop - 1`` of ``source`` now and yield them: the
        ``streamed`` strategy's reads of a worker's checkpoint directory (not
        confined to a root).

        Every read is proven against ``stamps``, the files as scanned at packing
        (None: as found now, for a plain read of one version), so a file changed
        since packing or while streamed raises SourceChangedError naming it. With
        ``verify``, each chunk is also compared with the checksum taken at packing,
        so a directory that changed since then is reported here, naming the files,
        rather than as corrupt bytes on the reader's side. A checksum may still be a
        ref (its packing task has not finished): the stream then waits for it.
        """
        if stamps is None:
            stamps = current_stamps(source, files)
        chunks = read_chunks_ahead(source, files, stamps, chunk_bytes, start, stop)
        for index, view, checksum in chunks:
            wanted = checksums[index] if verify else checksum
            expected = wanted if isinstance(wanted, str) else get(wanted)
            if isinstance(expected, BaseException):  # the checksum pass failed
                raise fresh(expected)
            if checksum != expected:
                # Which files the chunk carries is only worked out for the message.
                sizes = [f.size for f in files]
                chunk_spans = next(iter_chunk_spans(sizes, chunk_bytes, index))
                names = sorted({files[s.file_index].path for s in chunk_spans})
                raise SourceChangedError(
                    errno.EAGAIN,
                    f"checkpoint {source.root!r} changed since it was packed: chunk "
                    f"{index} (files {', '.join(map(repr, names))}) no longer has the "
                    "bytes it had; pack it again",
                    source.root,
                )
            with self._lock:
                self.bytes_streamed += memoryview(view).nbytes
            # The yielded array is copied into the object store before the generator
            # resumes, so the reader thread may reuse this buffer afterwards.
            yield np.frombuffer(view, dtype=np.uint8)

    @served
    @in_group(PACK_GROUP)
    def pack_chunks(self, source: Source, plans: Sequence[ChunkPlan]) -> object:
        """The chunks of ``plans`` and then their checksums: ``2 * len(plans)``
        objects (the caller sets ``num_returns``), owned by whoever submitted this.
        A packing error is returned in place of each checksum (see ``_failed``)."""
        return self._chunks(self._packer.pack, source, plans)

    @served
    @in_group(PACK_GROUP)
    def checksum_chunks(self, source: Source, plans: Sequence[ChunkPlan]) -> object:
        """Only the checksums of ``plans``' chunks (``streamed``), one object each."""
        try:
            checksums = self._packer.checksums(source, plans)
        except Exception as e:
            return _failed(e, 0, len(plans))
        metrics.add_bytes("packed", sum(plan.length for plan in plans), "streamed")
        return _returns(checksums)

    @served
    @in_group(PACK_GROUP)
    def store_chunks(self, source: Source, plans: Sequence[ChunkPlan]) -> object:
        """The chunks of ``plans``, those mapped left unhashed, and a status per chunk
        (its checksum, None where it is to be taken of the stored copy, or the
        packing error): ``2 * len(plans)`` objects, as ``pack_chunks``."""
        return self._chunks(self._packer.pack_unhashed, source, plans)

    @served
    @in_group(PACK_GROUP)
    def checksum_stored(self, *chunks: np.ndarray) -> object:
        """The checksums of chunks already in the object store (Ray hands each over
        as a zero-copy view of the stored bytes), one object each: a blocking
        caller stored them straight from their mapped files (``shared_pack``)."""
        return _returns([chunk_checksum(chunk) for chunk in chunks])

    @served
    @in_group(PACK_GROUP)
    def pack_stream(self, source: Source, plans: Sequence[ChunkPlan]) -> object:
        """The whole (small, ``inline``) stream as one array, then the checksum of each
        chunk: ``1 + len(plans)`` objects (the caller sets ``num_returns``)."""
        try:
            stream, checksums = self._packer.pack_stream(source, plans)
        except Exception as e:
            return _failed(e, 1, len(plans))
        self._count(plans, "inline")
        return _returns([stream, *checksums])

    @served
    def packed(self, *checksums: Status) -> tuple[Status, ...]:
        """Runs once every chunk of a transfer is packed (its arguments are the
        checksums' refs, resolved first): the completion a ``TransferFuture`` waits
        for, failing with the first packing error."""
        for checksum in checksums:
            if isinstance(checksum, BaseException):
                raise fresh(checksum)
        return checksums

    def _chunks(self, pack: PackChunks, source: Source, plans: Sequence[ChunkPlan]) -> object:
        """The returns of a task packing ``plans`` into one object each with ``pack``:
        the chunks, then their statuses; empty chunks and the error if it fails."""
        try:
            chunks, statuses = pack(source, plans)
        except Exception as e:
            return _failed(e, len(plans), len(plans))
        self._count(plans, "chunked")
        return _returns([*chunks, *statuses])

    def _count(self, plans: Sequence[ChunkPlan], strategy: str) -> None:
        """Count the bytes of ``plans`` as packed into objects, here and in the
        metrics (``air_transfer.observe.metrics``) of the strategy packing them."""
        nbytes = sum(plan.length for plan in plans)
        with self._lock:
            self.bytes_packed += nbytes
        metrics.add_bytes("packed", nbytes, strategy)


def _returns(values: Sequence[object]) -> object:
    """What a task returns as ``len(values)`` objects: the value itself for one."""
    return values[0] if len(values) == 1 else tuple(values)


def _failed(error: Exception, chunks: int, checksums: int) -> object:
    """The returns of a packing task that failed: empty chunks, and ``error`` in the
    place of every checksum. Returned, not raised: a reader checks a chunk's checksum
    before its bytes and raises the error it finds there, the completion task raises
    it for the future, and Ray has no error objects that nobody reads to log as
    "unhandled" (the chunks of a failed transfer after the first one it raised)."""
    empty = np.empty(0, dtype=np.uint8)
    return _returns([*([empty] * chunks), *([error] * checksums)])
