"""The per-node agent: a long-lived actor that hosts air-transfer's node services.

An object in Ray lives only as long as the process that created it (its owner), and
Ray 2.56 removed ``ray.put(_owner=...)``. A training worker that packs a checkpoint
and exits takes the chunks with it. ``TransferConfig(owner="node")`` packs inside
this agent instead: one actor per node (0 CPUs, found by name, started on demand,
pinned to its node), detached so it outlives the job that started it
(``air_transfer.nodes`` finds or starts it).

The agent is a composition root: each method hands its work to a service of a lower
layer (packing, the ``streamed`` reader, node storage's disk side, the storage sink)
and adds nothing but the process those services run in. Nothing below imports it.

Paths: node storage's methods (``disk``, ``disk_read``) confine every path they are
given, staging paths and both ends of a move included, to the storage root the
caller names, through ``storage.confine`` (no symlink leads out, even one made while
the operation runs). ``pack`` and ``stream`` read a checkpoint directory that a
worker of this node names, anywhere on this node, by design (``owner="node"`` and the
``streamed`` strategy serve the worker's own directories; a handle carries no root);
``store_checkpoint`` writes where the run's storage says, confined to the root when
that is node storage; ``store_report`` writes Ray Train's reports into node storage,
confined to the root, and copies a reporting worker's directory on this node from
wherever it is. The root is the caller's: these confine what a filesystem
user's *paths* reach, not what a Ray client may do (any Ray task can run code on any
node).

Lifetime: an agent lives until ``shutdown_agents()`` is called or its node or the
cluster stops. It keeps no chunk alive by itself: chunks it packed stay in the object
store exactly as long as some checkpoint, handle or ObjectRef anywhere refers to them
(Ray's borrower counting), and are freed when the last one is gone.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import ray

from air_transfer import metrics
from air_transfer.checkpoint import ChunkedCheckpoint, submit_transfer
from air_transfer.config import TransferConfig
from air_transfer.errors import SourceChangedError
from air_transfer.handle import TransferHandle, fresh
from air_transfer.layout import Source, Stamp, iter_chunk_spans
from air_transfer.manifest import Entry, chunk_checksum
from air_transfer.nodes import PACK_GROUP
from air_transfer.packing import (
    ChunkPacker,
    ChunkPlan,
    current_stamps,
    fill_chunk,
    read_chunks_ahead,
)
from air_transfer.storage.disk import DiskStorage, storage_path
from air_transfer.storage.disk_chunks import DirectoryTransfers, FileChunks
from air_transfer.storage.disk_reads import read_chunks
from air_transfer.storage.disk_uploads import DiskUploads
from air_transfer.storage.report_ledger import ReportLedger
from air_transfer.storage.sink import store_checkpoint, store_report
from air_transfer.strategies.agent_tasks import submit_plans


class NodeAgent:
    """Owns the chunks it packs, streams the files of its node, and stores files on
    its disk for the node storage filesystem."""

    def __init__(self) -> None:
        self._packer = ChunkPacker()
        self._files = FileChunks(submit_plans)
        self._stored = 0  # checkpoints written by store_checkpoint and store_report
        self._reports = ReportLedger()
        self._directories = DirectoryTransfers(
            lambda source, config: submit_transfer(source, config.replace(owner="node"))[:2]
        )
        services = (DiskStorage(), DiskUploads())
        self._disk_ops: dict[str, Callable[..., Any]] = {
            name: getattr(service, name) for service in services for name in type(service).OPS
        }

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def pid(self) -> int:
        return os.getpid()

    def store_checkpoint(
        self, checkpoint: ChunkedCheckpoint | TransferHandle, filesystem: pafs.FileSystem, path: str
    ) -> str:
        """Write a transferred checkpoint to ``path`` on ``filesystem``, reached from
        this node (``checkpoint_upload_fn``), chunk by chunk as they are packed."""
        if isinstance(checkpoint, ChunkedCheckpoint):
            checkpoint = checkpoint.handle()
        stored = store_checkpoint(checkpoint, filesystem, path)
        self._stored += 1
        return stored

    def store_report(
        self,
        worker: str,
        source: ChunkedCheckpoint | str,
        root: str,
        path: str,
        config: TransferConfig,
    ) -> str:
        """Store Ray Train worker ``worker``'s reported checkpoint at node-storage
        ``path``: its transfer, or its directory on this node. Noted until Train
        stops the worker's group (``reclaim_reports``)."""
        src = source if isinstance(source, str) else source.handle()
        local = storage_path(root, path)
        stored = self._reports.store(
            worker, local, lambda check: store_report(src, root, local, config, check)
        )
        self._stored += 1
        return stored

    def reclaim_reports(self, root: str, workers: list[str], tracked: list[str]) -> list[str]:
        """Ray Train is stopping the group of ``workers``: end their reports still
        being stored and delete the checkpoints they stored that Train does not
        track (``tracked``); returns the paths deleted."""
        storage = DiskStorage()
        kept = [storage_path(root, path) for path in tracked]
        return self._reports.reclaim(workers, kept, lambda path: storage.fs_delete_dir(root, path))

    def disk(self, op: str, root: str, *args: Any) -> Any:
        """Run node-storage operation ``op`` (an ``fs_*`` method of ``DiskStorage`` or
        ``DiskUploads``) on this node's disk, confined to ``root``."""
        try:
            method = self._disk_ops[op]
        except KeyError:
            raise ValueError(
                f"unknown node-storage operation {op!r}; known: {', '.join(sorted(self._disk_ops))}"
            ) from None
        return method(root, *args)

    def disk_read(
        self, root: str, path: str, size: int, chunk_bytes: int, first: int
    ) -> Iterator[np.ndarray]:
        """Stream chunks ``first``.. of node-storage file ``path`` (``size`` bytes),
        confined to ``root``: the reads of ``storage_filesystem``."""
        yield from read_chunks(root, path, size, chunk_bytes, first)

    def file_chunks(
        self,
        root: str,
        path: str,
        size: int,
        chunk_bytes: int,
        first: int,
        count: int,
        budget: int,
    ) -> list[list[tuple[Any, Any]]]:
        """Refs of ``count`` chunks of node-storage file ``path`` from ``first``, as
        ``(chunk, checksum)`` pairs, packed once and shared (``disk_chunks``); nested
        in a list so that the caller borrows them rather than waiting for them."""
        return [self._files.refs(root, path, size, chunk_bytes, first, count, budget)]

    def directory_transfer(
        self, root: str, path: str, config: TransferConfig
    ) -> list[ray.ObjectRef[Any]]:
        """A transfer of node-storage checkpoint directory ``path`` as it is now, owned
        by this agent and shared by readers (``disk_chunks.DirectoryTransfers``):
        Ray Train's restores on other nodes; nested so the caller borrows it."""
        return [self._directories.ref(root, path, config)]

    def read_counters(self) -> dict[str, int]:
        """What node storage cost this node: bytes read from disk and served (file
        reads and whole-directory transfers, a directory's bytes served once per
        reader that asked for it), whole-directory transfers packed, checkpoints
        stored."""
        counters = self._files.counters()
        directories = self._directories
        counters["bytes_read"] += directories.bytes_read
        counters["bytes_served"] += directories.bytes_served
        return {
            **counters,
            "transfers_packed": directories.started,
            "checkpoints_stored": self._stored,
        }

    def clear_read_cache(self) -> None:
        """Let go of every cached node-storage chunk and directory transfer (readers
        keep what they hold)."""
        self._files.clear()
        self._directories.clear()

    def stream(
        self,
        source: Source,
        files: Sequence[Entry],
        chunk_bytes: int,
        checksums: Sequence[Any],
        start: int,
        stop: int | None,
        verify: bool = True,
        stamps: Sequence[Stamp] | None = None,
    ) -> Iterator[np.ndarray]:
        """Read chunks ``start``..``stop - 1`` of ``source`` now and yield them: the
        ``streamed`` strategy's reads of a worker's checkpoint directory (not
        confined to a root; node storage reads through ``disk_read``).

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
            expected = checksums[index] if verify else checksum
            if not isinstance(expected, str):
                expected = ray.get(expected)
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
            # The yielded array is copied into the object store before the generator
            # resumes, so the reader thread may reuse this buffer afterwards.
            yield np.frombuffer(view, dtype=np.uint8)

    # -- packing, one task per chunk (``strategies.agent_tasks``) --------------------
    @ray.method(concurrency_group=PACK_GROUP)
    def pack_chunks(self, source: Source, plans: Sequence[ChunkPlan]) -> Any:
        """The chunks of ``plans`` and then their checksums: ``2 * len(plans)``
        objects (the caller sets ``num_returns``), owned by whoever submitted this.
        A packing error is returned in place of each checksum (see ``_failed``)."""
        try:
            chunks, checksums = self._packer.pack(source, plans)
        except Exception as e:
            return _failed(e, len(plans), len(plans))
        _packed(plans, "chunked")
        return _returns([*chunks, *checksums])

    @ray.method(concurrency_group=PACK_GROUP)
    def checksum_chunks(self, source: Source, plans: Sequence[ChunkPlan]) -> Any:
        """Only the checksums of ``plans``' chunks (``streamed``), one object each."""
        try:
            checksums = self._packer.checksums(source, plans)
        except Exception as e:
            return _failed(e, 0, len(plans))
        _packed(plans, "streamed")
        return _returns(checksums)

    @ray.method(concurrency_group=PACK_GROUP)
    def pack_stream(self, source: Source, plans: Sequence[ChunkPlan]) -> Any:
        """The whole (small, ``inline``) stream as one array, then the checksum of each
        chunk: ``1 + len(plans)`` objects (the caller sets ``num_returns``)."""
        total = sum(plan.length for plan in plans)
        stream = np.empty(total, dtype=np.uint8)
        checksums = []
        offset = 0
        try:
            for plan in plans:
                view = memoryview(stream)[offset : offset + plan.length]
                fill_chunk(source, plan, view)
                checksums.append(chunk_checksum(view))
                offset += plan.length
        except Exception as e:
            return _failed(e, 1, len(plans))
        _packed(plans, "inline")
        return _returns([stream, *checksums])

    def packed(self, *checksums: str | BaseException) -> tuple[str | BaseException, ...]:
        """Runs once every chunk of a transfer is packed (its arguments are the
        checksums' refs, resolved first): the completion a ``TransferFuture`` waits
        for, failing with the first packing error."""
        for checksum in checksums:
            if isinstance(checksum, BaseException):
                raise fresh(checksum)
        return checksums

    def submit_transfer(
        self, source: Source, config: TransferConfig
    ) -> list[ray.ObjectRef[Any] | str | None]:
        """Start packing ``source`` here (``owner="node"``): this agent submits the
        chunk tasks to itself, so it owns the chunks and the checkpoint object, and
        they outlive the caller even while packing is still running. Returns
        ``[checkpoint ref, completion ref or None, strategy name]``, the refs nested
        so the caller borrows."""
        ref, done, strategy = submit_transfer(source, config)
        return [ref, done, strategy]


def _packed(plans: Sequence[ChunkPlan], strategy: str) -> None:
    """Count the bytes of ``plans`` as packed (``air_transfer.metrics``) by the
    strategy whose packing task this is."""
    metrics.add_bytes("packed", sum(plan.length for plan in plans), strategy)


def _returns(values: list[Any]) -> Any:
    """What a task returns as ``len(values)`` objects: the value itself for one."""
    return values[0] if len(values) == 1 else tuple(values)


def _failed(error: Exception, chunks: int, checksums: int) -> Any:
    """The returns of a packing task that failed: empty chunks, and ``error`` in the
    place of every checksum. Returned, not raised: a reader checks a chunk's checksum
    before its bytes and raises the error it finds there, the completion task raises
    it for the future, and Ray has no error objects that nobody reads to log as
    "unhandled" (the chunks of a failed transfer after the first one it raised)."""
    empty = np.empty(0, dtype=np.uint8)
    return _returns([*([empty] * chunks), *([error] * checksums)])
