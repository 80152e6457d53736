"""The per-node agent: a long-lived actor that hosts air-transfer's node services.

An object in Ray lives only as long as its owner, and Ray 2.56 removed
``ray.put(_owner=...)``: a worker that packs a checkpoint and exits takes the chunks
with it. ``TransferConfig(owner="node")`` packs inside this agent instead: one actor
per node (0 CPUs, found by name, pinned, detached so it outlives the job).

A composition root: each method is one line handing its call to a service of a lower
layer (``transfer.packing_service``, ``storage.server``), which the typed client
``cluster.agent_client.AgentClient`` mirrors method for method. Paths given to node
storage's methods are confined to the root the caller names; the packing methods read
the worker's own directories on this node, by design. It keeps no chunk alive by
itself: chunks stay as long as some ref anywhere refers to them and, for a transfer
packed for another process, as long as that process holds its lease
(``cluster.transfer_leases``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import ray

from air_transfer.cluster import liveness
from air_transfer.cluster.agent_client import Expect, Info, Listed
from air_transfer.cluster.identity import Identity, this_process
from air_transfer.cluster.nodes import HANDOVER_GROUP, PACK_GROUP, RELAY_GROUP
from air_transfer.config import TransferConfig
from air_transfer.core import process_locks
from air_transfer.core.entry import Entry
from air_transfer.core.file_chunks import ChunkedFiles
from air_transfer.core.knobs import KNOBS
from air_transfer.core.plan import ChunkPlan
from air_transfer.core.process_locks import Process, ProcessLock
from air_transfer.core.scan import Source, Stamp
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.server.chunk_cache import DirectoryTransfers, FileChunks
from air_transfer.storage.server.drain import DrainStatus
from air_transfer.storage.server.incremental import IncrementalStore
from air_transfer.storage.server.metadata import DiskStorage, storage_path
from air_transfer.storage.server.op_fence import OpFence
from air_transfer.storage.server.reads import read_chunks
from air_transfer.storage.server.replica_marker import claim as claim_copy
from air_transfer.storage.server.report_ledger import ReportLedger
from air_transfer.storage.server.senders import sender
from air_transfer.storage.server.sink import store_checkpoint, store_report
from air_transfer.storage.server.stream_uploads import StreamUploads
from air_transfer.storage.server.tiered_disk import TieredDisk
from air_transfer.storage.server.upload_writers import UploadWriters
from air_transfer.storage.server.uploads import DiskUploads
from air_transfer.transfer.agent_tasks import submit_plans
from air_transfer.transfer.handle import TransferHandle
from air_transfer.transfer.live_chunks import LiveChunks
from air_transfer.transfer.packing_service import PackingService
from air_transfer.transfer.relay import Relays
from air_transfer.transfer.route import start_on_this_thread
from air_transfer.transfer.start import prepare, start
from air_transfer.transfer.strategies import Registrations


def _owned_transfer(source: Source, config: TransferConfig) -> tuple[Any, Any]:
    """A transfer this agent owns (the chunk cache's whole-directory transfers)."""
    ref, done, _ = start_on_this_thread(source, config.replace(owner="node"))
    return ref, done


class NodeAgent:
    """Owns the chunks it packs, streams the files of its node, and stores files on
    its disk for the node storage filesystem."""

    def __init__(self) -> None:
        self._packing = PackingService()
        self._relays = Relays()
        self._files = FileChunks(submit_plans)
        self._directories = DirectoryTransfers(_owned_transfer)
        #: Metadata, with the durable tier of each root that has one (its drain).
        self._disk = TieredDisk(DiskStorage(), str(ray.get_runtime_context().get_node_id()))
        self._disk.resume()
        self._ops = OpFence()  # replicated changes of a caller that died: refused
        # Uploads of writers that died are discarded (their staging files removed).
        self._uploads = DiskUploads(
            UploadWriters(
                liveness.dead,
                lambda root, staging: self._uploads.fs_abort(root, staging),
                KNOBS.upload_reap_s,
            )
        )
        self._stored = 0  # checkpoints written by store_checkpoint and store_report
        self._reports = ReportLedger()
        self._incremental = IncrementalStore()
        self._streams = StreamUploads(self._uploads, self._incremental)
        #: Transfers packed for another process, held until it lets go (``release``).
        self._leases: dict[str, tuple[ray.ObjectRef[Any], tuple[int, str] | None, str]] = {}
        #: The chunks of those transfers, for later ones (``reuse_chunks``).
        self._live = LiveChunks()

    # -- the agent itself --------------------------------------------------------------
    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def pid(self) -> int:
        return os.getpid()

    def identity(self) -> Identity:
        """The air-transfer version and settings this agent runs with (callers
        refuse an agent of another version: ``cluster.identity``)."""
        return this_process()

    def read_counters(self) -> dict[str, int]:
        """What node storage cost this node: bytes read from disk, served and held
        (file chunks and whole-directory transfers), transfers packed and their
        readers in flight, checkpoints stored; and what packing did: bytes packed
        into chunk objects, chunks (and their bytes) reused from live transfers."""
        counters = self._files.counters()
        counters["bytes_read"] += self._directories.bytes_read
        counters["bytes_served"] += self._directories.bytes_served
        counters["bytes_held"] += self._directories.bytes_held
        return {
            **counters,
            "transfers_packed": self._directories.started,
            "transfer_readers": self._directories.readers(),
            "checkpoints_stored": self._stored,
            "bytes_packed": self._packing.bytes_packed,
            "chunks_reused": self._live.chunks_reused,
            "bytes_reused": self._live.bytes_reused,
        }

    def incremental_counters(self) -> dict[str, int]:
        """What this agent's incremental stores reused and received, summed
        (``storage.server.incremental.STATS``)."""
        return self._incremental.totals()

    def clear_read_cache(self) -> None:
        """Let go of every cached node-storage chunk and directory transfer."""
        self._files.clear()
        self._directories.clear()

    def dead_processes(self, locks: list[ProcessLock]) -> list[ProcessLock]:
        """Those of ``locks`` (of this node's processes) whose process is dead."""
        return process_locks.dead(locks)

    # -- packing (``transfer.packing_service``) ----------------------------------------
    @ray.method(concurrency_group=PACK_GROUP)
    def pack_chunks(self, source: Source, plans: Sequence[ChunkPlan]) -> Any:
        return self._packing.pack_chunks(source, plans)

    @ray.method(concurrency_group=PACK_GROUP)
    def checksum_chunks(self, source: Source, plans: Sequence[ChunkPlan]) -> Any:
        return self._packing.checksum_chunks(source, plans)

    @ray.method(concurrency_group=PACK_GROUP)
    def store_chunks(self, source: Source, plans: Sequence[ChunkPlan]) -> Any:
        return self._packing.store_chunks(source, plans)

    @ray.method(concurrency_group=PACK_GROUP)
    def checksum_stored(self, *chunks: Any) -> Any:
        return self._packing.checksum_stored(*chunks)

    @ray.method(concurrency_group=PACK_GROUP)
    def pack_stream(self, source: Source, plans: Sequence[ChunkPlan]) -> Any:
        return self._packing.pack_stream(source, plans)

    def packed(self, *checksums: str | BaseException) -> tuple[str | BaseException, ...]:
        return self._packing.packed(*checksums)

    @ray.method(concurrency_group=RELAY_GROUP)
    def relayed(self, key: str, pid: int) -> Any:
        return self._relays.take(key, pid, KNOBS.relay_poll_s)

    @ray.method(concurrency_group=HANDOVER_GROUP)
    def relay(self, key: str, value: Any) -> None:
        self._relays.give(key, value)

    def relays_waiting(self) -> int:
        return self._relays.waiting()

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
        yield from self._packing.stream(
            source, files, chunk_bytes, checksums, start, stop, verify, stamps
        )

    def submit_transfer(
        self,
        source: Source,
        config: TransferConfig,
        registered: Registrations | None = None,
        requester: tuple[int, str] | None = None,
    ) -> list[Any]:
        """Pack ``source`` here (``owner="node"``) with the strategies ``registered``
        in the caller: this agent submits the chunk tasks, so it owns them, and holds
        the checkpoint (a lease, ``cluster.transfer_leases``) until ``requester`` (pid, node)
        says it references none of its refs. ``[checkpoint ref, completion ref,
        strategy, hex ids of the refs nested in it]``, nested so the caller borrows."""
        live = self._live if config.reuse_chunks else None
        started = start(prepare(source, config, registered), live)
        ref, handle = started.put(), started.handle
        self._leases[ref.hex()] = (ref, requester, handle.transfer_id)
        return [ref, started.done, handle.strategy.name, [r.hex() for r in handle.refs()]]

    def release(self, *keys: str) -> None:
        """Drop the leases ``keys``: each transfer then lives as long as Ray counts
        a reference to it, and no later transfer reuses its chunks."""
        dropped = [self._leases.pop(key, None) for key in keys]
        self._live.drop(lease[2] for lease in dropped if lease is not None)

    def leases(self) -> dict[str, tuple[int, str] | None]:
        """The transfers held for another process: lease key -> requester (pid,
        node); a requester that died leaves its leases until ``shutdown_agents()``."""
        return {key: requester for key, (_, requester, _) in self._leases.items()}

    # -- node storage: checkpoints (``storage.server``) --------------------------------
    def store_checkpoint(self, checkpoint: Any, filesystem: pafs.FileSystem, path: str) -> str:
        """Write a transferred checkpoint (a ``ChunkedCheckpoint``, above this layer,
        or its handle) to ``path`` on ``filesystem``, chunk by chunk as packed."""
        handle = checkpoint if isinstance(checkpoint, TransferHandle) else checkpoint.handle()
        stored = store_checkpoint(handle, filesystem, path)
        self._stored += 1
        return stored

    def store_report(
        self, worker: str, source: Any, root: str, path: str, config: TransferConfig, op: str = ""
    ) -> str:
        """Store Ray Train worker ``worker``'s reported checkpoint at node-storage
        ``path``: its transfer (a ``ChunkedCheckpoint``), or its directory on this
        node. Noted until Train stops the worker's group (``reclaim_reports``)."""
        src = source if isinstance(source, str) else source.handle()
        local = storage_path(root, path)
        with self._ops.running(op):
            stored = self._reports.store(
                worker, local, lambda check: store_report(src, root, local, config, check)
            )
        self._stored += 1
        self._disk.touch(root)
        return stored

    def store_incremental(
        self,
        worker: str | None,
        root: str,
        path: str,
        source: Source,
        sender_node: str,
        files: ChunkedFiles,
        config: TransferConfig,
    ) -> dict[str, int]:
        """Store the checkpoint ``files`` describes at node-storage ``path`` from what
        this node holds, fetching the rest from ``source`` on ``sender_node``; what
        it cost. A Ray Train report (``worker`` given) is noted as ``store_report``'s."""
        local, send = storage_path(root, path), sender(source, sender_node, config.window)
        try:
            if worker is None:
                return self._incremental.store(root, local, files, send)
            return self._reports.store(
                worker, local, lambda c: self._incremental.store(root, local, files, send, c)
            )
        finally:
            self._disk.touch(root)

    def note_report_dir(self, root: str, worker: str, path: str) -> None:
        """Make the directory ``path`` that Ray Train worker ``worker`` writes its report
        into itself (torch DCP), noted as ``store_report``'s are."""
        local = storage_path(root, path)
        self._reports.note(worker, local, lambda: self._disk.fs_create_dir(root, local, True))

    def reclaim_reports(self, root: str, workers: list[str], tracked: list[str]) -> list[str]:
        """Ray Train is stopping the group of ``workers``: end their reports still
        being stored and delete what they stored that Train does not track."""
        kept = [storage_path(root, path) for path in tracked]
        return self._reports.reclaim(workers, kept, lambda p: self._disk.fs_delete_dir(root, p))

    def directory_transfer(self, root: str, path: str, config: TransferConfig) -> list[Any]:
        """``[ref, lease]``: nested so the caller borrows the ref; the lease goes back
        to ``release_directory_transfer`` when the reader is done."""
        return list(self._directories.ref(root, path, config))

    def release_directory_transfer(self, lease: str) -> None:
        self._directories.release(lease)

    def file_chunks(
        self, root: str, path: str, size: int, chunk_bytes: int, first: int, count: int, budget: int
    ) -> list[list[tuple[Any, Any]]]:
        return [self._files.refs(root, path, size, chunk_bytes, first, count, budget)]

    def disk_read(
        self, root: str, path: str, size: int, chunk_bytes: int, first: int
    ) -> Iterator[np.ndarray]:
        yield from read_chunks(root, path, size, chunk_bytes, first)

    # -- node storage: metadata --------------------------------------------------------
    def fs_info(self, root: str, paths: list[str]) -> list[Info]:
        return self._disk.fs_info(root, paths)

    def fs_list(self, root: str, base: str, recursive: bool, allow_not_found: bool) -> list[Listed]:
        return self._disk.fs_list(root, base, recursive, allow_not_found)

    def fs_create_dir(self, root: str, path: str, recursive: bool, op: str = "") -> None:
        with self._ops.running(op):
            self._disk.fs_create_dir(root, path, recursive)

    def fs_delete_dir(self, root: str, path: str, op: str = "") -> None:
        with self._ops.running(op):
            self._disk.fs_delete_dir(root, path)

    def fs_delete_dir_contents(
        self, root: str, path: str, missing_dir_ok: bool, op: str = ""
    ) -> None:
        with self._ops.running(op):
            self._disk.fs_delete_dir_contents(root, path, missing_dir_ok)

    def fs_delete_file(self, root: str, path: str, op: str = "") -> None:
        with self._ops.running(op):
            self._disk.fs_delete_file(root, path)

    def fs_move(self, root: str, src: str, dest: str, op: str = "") -> None:
        with self._ops.running(op):
            self._disk.fs_move(root, src, dest)

    # -- node storage: replicas --------------------------------------------------------
    def claim_copy(
        self, root: str, storage: str, node: str, members: list[str], taken: list[str], adopt: bool
    ) -> bool:
        return claim_copy(root, storage, node, members, taken, adopt)

    def fence_ops(self, ops: list[str], timeout_s: float) -> list[str]:
        return self._ops.fence(ops, timeout_s)

    # -- node storage: uploads ---------------------------------------------------------
    def fs_copy_file(self, root: str, src: str, dest: str, op: str = "") -> None:
        with self._ops.running(op):
            self._uploads.fs_copy_file(root, src, dest)
        self._disk.touch(root)

    def fs_open_write(
        self, root: str, path: str, append: bool, writer: Process | None = None
    ) -> tuple[str, int, Expect]:
        return self._uploads.fs_open_write(root, path, append, writer)

    def fs_write(
        self,
        root: str,
        staging: str,
        offset: int,
        data: Any,
        checksum: str,
        direct_io: bool = False,
    ) -> None:
        self._uploads.fs_write(root, staging, offset, data, checksum, direct_io)

    def fs_commit(
        self,
        root: str,
        path: str,
        staging: str,
        offset: int,
        tail: Any,
        checksum: str,
        size: int,
        direct_io: bool = False,
        expect: Expect = None,
        op: str = "",
    ) -> None:
        with self._ops.running(op):
            self._uploads.fs_commit(
                root, path, staging, offset, tail, checksum, size, direct_io, expect
            )
        self._disk.touch(root)

    def fs_abort(self, root: str, staging: str) -> None:
        self._uploads.fs_abort(root, staging)

    def fs_write_or_reuse(
        self,
        root: str,
        staging: str,
        offset: int,
        checksum: str,
        length: int,
        sent: list[Any],
        direct_io: bool = False,
    ) -> bool:
        return self._streams.fs_write_or_reuse(
            root, staging, offset, checksum, length, sent, direct_io
        )

    def fs_commit_indexed(
        self,
        root: str,
        path: str,
        staging: str,
        offset: int,
        tail: Any,
        checksum: str,
        size: int,
        sums: tuple[str, ...],
        chunk_bytes: int,
        direct_io: bool = False,
        expect: Expect = None,
    ) -> None:
        self._streams.fs_commit_indexed(
            root, path, staging, offset, tail, checksum, size, sums, chunk_bytes, direct_io, expect
        )
        self._disk.touch(root)

    # -- node storage: the durable tier (``storage.server.tiered_disk``) ----------------
    def durable_attach(
        self,
        root: str,
        target: DurableTarget,
        settings: DrainSettings,
        replica: tuple[str, str] | None = None,
    ) -> str:
        return self._disk.attach(root, target, settings, replica)

    def durable_request(self, root: str) -> tuple[str, int]:
        return self._disk.request(root)

    def durable_status(self, root: str, path: str | None = None) -> DrainStatus:
        return self._disk.status(root, path)

    def durable_locate(self, root: str, path: str) -> tuple[Info, bool]:
        return self._disk.locate(root, path)
