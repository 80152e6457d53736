"""Node storage, what the storage node's agent runs: ``NodeStorageService`` and the
services it is made of (``services``), behind the Protocols of ``storage.node_api``
(their subclasses, so mypy holds them to their signatures): itself for copies,
reads and checkpoints, ``uploads.DiskUploads`` for uploads,
``drain.tiered.TieredDisk`` for metadata and the durable tier,
``stream_uploads.StreamUploads`` for incremental uploads.

Each method hands its call to the module that does the work (``uploads``,
``chunk_cache``, ``sink``, ``incremental``...). What every change needs, its fence
and the drain's wake, is no method's: the agent applies ``rules`` around every call
(``changes``). The agent hosts one and hands it the two ways it packs
(``FileChunks``' chunk tasks and ``DirectoryTransfers``' whole-directory
transfers), which sit above this layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.fs as pafs

from air_transfer.cluster import liveness
from air_transfer.cluster.refs import ChecksumRef, ChunkRef
from air_transfer.config import TransferConfig
from air_transfer.core.knobs import KNOBS
from air_transfer.storage.node_api import NodeCheckpoints, NodeCopies, NodeReads, SenderOffer
from air_transfer.storage.server.changes import ChangeRules
from air_transfer.storage.server.chunk_cache import FileChunks, Submit, cache_cap
from air_transfer.storage.server.directory_transfers import (
    DirectoryTransfers,
    Relay,
    StartTransfer,
)
from air_transfer.storage.server.drain.holder_sends import HolderSends
from air_transfer.storage.server.drain.tiered import TieredDisk
from air_transfer.storage.server.incremental import IncrementalStore
from air_transfer.storage.server.metadata import DiskStorage, storage_path
from air_transfer.storage.server.op_fence import OpFence
from air_transfer.storage.server.reads import read_stored_chunks, read_stub_head, stub_heads_under
from air_transfer.storage.server.replica_marker import claim as claim_copy
from air_transfer.storage.server.report_ledger import ReportLedger
from air_transfer.storage.server.senders import sender
from air_transfer.storage.server.sink import store_checkpoint, store_report
from air_transfer.storage.server.stream_uploads import StreamUploads
from air_transfer.storage.server.upload_writers import UploadWriters
from air_transfer.storage.server.uploads import DiskUploads
from air_transfer.transfer.handle import TransferHandle

if TYPE_CHECKING:
    pass  # collections.abc.Buffer from Python 3.12


class NodeStorageService(NodeCopies, NodeReads, NodeCheckpoints):
    """Node storage on this node's disk, for the agent of node ``node_id``, whose
    object store holds ``store_bytes`` (None: unknown), which bounds its read caches."""

    def __init__(
        self,
        node_id: str,
        submit: Submit,
        start: StartTransfer,
        handle_of: Callable[[object], TransferHandle],
        store_bytes: int | None = None,
        relay: Relay | None = None,
        live_nodes: Callable[[], set[str]] = set,
    ) -> None:
        self._files = FileChunks(submit, cache_cap(store_bytes))
        self._directories = DirectoryTransfers(
            start, cache_cap(store_bytes), relay, live_nodes, here=node_id
        )
        self._handle_of = handle_of  # a transfer's handle, of a checkpoint or handle
        #: Metadata, with the durable tier of each root that has one (its drain).
        self._disk = TieredDisk(DiskStorage(), node_id)
        self._disk.resume()
        #: This node's part in writer-placed storages' drains: the bytes it holds, sent.
        self._holder_sends = HolderSends()
        self._ops = OpFence()  # replicated changes of a caller that died: refused
        #: What every change obeys: its fence, then the drain's wake (``changes``).
        self.rules = ChangeRules(self._ops, self._disk.touch)
        # Uploads of writers that died are discarded (their staging files removed).
        self._uploads = DiskUploads(
            UploadWriters(
                liveness.dead,
                lambda root, staging: self._uploads.fs_abort(root, staging),
                KNOBS.upload_reap_s,
            )
        )
        self._reports = ReportLedger()
        self.incremental = IncrementalStore()
        #: Incremental uploads: a service of their own (``NodeIndexedUploads``).
        self.streams = StreamUploads(self._uploads, self.incremental)
        self._stored = 0  # checkpoints written by store_checkpoint and store_report

    @property
    def services(self) -> tuple[object, ...]:
        """What the agent hosts for node storage, each behind its Protocols."""
        return (self, self._uploads, self._disk, self.streams, self._holder_sends)

    def counters(self) -> dict[str, int]:
        """What node storage cost this node: bytes read from disk, served and held
        (file chunks and whole-directory transfers), transfers packed and their
        readers in flight, checkpoints stored, placed files' bytes sent to a durable
        tier from here."""
        counters = self._files.counters()
        counters["bytes_read"] += self._directories.bytes_read
        counters["bytes_served"] += self._directories.bytes_served
        counters["bytes_held"] += self._directories.bytes_held
        return {
            **counters,
            "transfers_packed": self._directories.started,
            "transfers_relayed": self._directories.relays,
            "transfer_readers": self._directories.readers(),
            "checkpoints_stored": self._stored,
            "placed_bytes_sent": self._holder_sends.bytes_sent,
        }

    def clear_cache(self) -> None:
        """Let go of every cached chunk and directory transfer."""
        self._files.clear()
        self._directories.clear()

    # -- checkpoints -------------------------------------------------------------------
    def store_checkpoint(self, checkpoint: object, filesystem: pafs.FileSystem, path: str) -> str:
        stored = store_checkpoint(self._handle_of(checkpoint), filesystem, path)
        self._stored += 1
        return stored

    def store_report(
        self, worker: str, src: object, root: str, path: str, config: TransferConfig, op: str = ""
    ) -> str:
        given = src if isinstance(src, str) else self._handle_of(src)
        local = storage_path(root, path)
        stored = self._reports.store(
            worker, local, lambda check: store_report(given, root, local, config, check)
        )
        self._stored += 1
        return stored

    def store_incremental(
        self, worker: str | None, root: str, path: str, offer: SenderOffer, config: TransferConfig
    ) -> dict[str, int]:
        local, files = storage_path(root, path), offer.files
        send = sender(offer.source, offer.node, config.window)
        if worker is None:
            return self.incremental.store(root, local, files, send)
        return self._reports.store(
            worker, local, lambda c: self.incremental.store(root, local, files, send, c)
        )

    def note_report_dir(self, root: str, worker: str, path: str) -> None:
        local = storage_path(root, path)
        self._reports.note(worker, local, lambda: self._disk.fs_create_dir(root, local, True))

    def reclaim_reports(self, root: str, workers: list[str], tracked: list[str]) -> list[str]:
        kept = [storage_path(root, path) for path in tracked]
        return self._reports.reclaim(workers, kept, lambda p: self._disk.fs_delete_dir(root, p))

    def reclaim_placed_reports(
        self, root: str, workers: list[str], tracked: list[str], nbytes: int
    ) -> tuple[list[str], list[tuple[str, int, bytes]]]:
        kept = [storage_path(root, path) for path in tracked]
        stubs: list[tuple[str, int, bytes]] = []

        def delete(path: str) -> None:
            stubs.extend(stub_heads_under(root, path, nbytes))  # read before they go
            self._disk.fs_delete_dir(root, path)

        return self._reports.reclaim(workers, kept, delete), stubs

    # -- reads -------------------------------------------------------------------------
    def directory_transfer(
        self, root: str, path: str, config: TransferConfig, node: str | None = None
    ) -> list[Any]:
        return list(self._directories.ref(root, path, config, node))

    def release_directory_transfer(self, lease: str) -> None:
        self._directories.release(lease)

    def file_chunks(
        self, root: str, path: str, size: int, chunk_bytes: int, first: int, count: int, budget: int
    ) -> list[list[tuple[ChunkRef, ChecksumRef]]]:
        return [self._files.refs(root, path, size, chunk_bytes, first, count, budget)]

    def disk_read(
        self, root: str, path: str, size: int, chunk_bytes: int, first: int
    ) -> Iterator[np.ndarray]:
        yield from read_stored_chunks(root, path, size, chunk_bytes, first)

    def placed_head(self, root: str, path: str, nbytes: int) -> tuple[int, bytes] | None:
        return read_stub_head(root, path, nbytes)

    # -- replicas ----------------------------------------------------------------------
    def claim_copy(
        self, root: str, storage: str, node: str, members: list[str], taken: list[str], adopt: bool
    ) -> bool:
        return claim_copy(root, storage, node, members, taken, adopt)

    def fence_ops(self, ops: list[str], timeout_s: float) -> list[str]:
        return self._ops.fence(ops, timeout_s)
