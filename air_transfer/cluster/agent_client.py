"""``AgentClient``: the one typed door to a node's agent.

Every call from the library to an agent goes through a method here whose signature
mirrors the agent's (``air_transfer.agent.NodeAgent``), so mypy checks each argument
where a string-dispatched RPC would hide it. A method submits the call and returns
what Ray's ``.remote()`` returns (an ObjectRef, several, or a streaming generator):
callers decide when to wait. The agent sits above this layer; it is reached by its
actor name (``nodes.node_agent``), never imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow.fs as pafs
import ray

from air_transfer.cluster import _ray
from air_transfer.cluster.nodes import node_agent, this_node_id
from air_transfer.config import TransferConfig
from air_transfer.core.entry import Entry
from air_transfer.core.file_chunks import ChunkedFiles
from air_transfer.core.plan import ChunkPlan
from air_transfer.core.process_locks import Process, ProcessLock
from air_transfer.core.scan import Source, Stamp

#: What node storage says of a path: ``(pyarrow FileType, size, mtime_ns)``.
Info = tuple[int, int | None, int | None]
#: One entry of a listing: ``(path relative to the listed base, type, size, mtime_ns)``.
Listed = tuple[str, int, int | None, int | None]
#: What an append expects to find at commit: (device, inode, size, mtime_ns) of the
#: file it copied, () for no file; None: a plain write, which expects nothing.
Expect = tuple[int, ...] | None

Ref = ray.ObjectRef[Any]


def _refs(refs: Any, count: int) -> list[Ref]:
    # num_returns=1 gives one ref, not a list of one.
    return [refs] if count == 1 else list(refs)


class AgentClient:
    """Calls to the agent of node ``node_id`` (default: this process's node), started
    if none runs yet."""

    def __init__(self, node_id: str | None = None, actor: Any = None) -> None:
        self.node_id = node_id or this_node_id()
        self.actor: Any = actor if actor is not None else node_agent(self.node_id)

    # -- the agent itself --------------------------------------------------------------
    def pid(self) -> ray.ObjectRef[int]:
        ref: ray.ObjectRef[int] = self.actor.pid.remote()
        return ref

    def read_counters(self) -> ray.ObjectRef[dict[str, int]]:
        ref: ray.ObjectRef[dict[str, int]] = self.actor.read_counters.remote()
        return ref

    def incremental_counters(self) -> ray.ObjectRef[dict[str, int]]:
        ref: ray.ObjectRef[dict[str, int]] = self.actor.incremental_counters.remote()
        return ref

    def clear_read_cache(self) -> ray.ObjectRef[None]:
        ref: ray.ObjectRef[None] = self.actor.clear_read_cache.remote()
        return ref

    def dead_processes(self, locks: Sequence[ProcessLock]) -> ray.ObjectRef[list[ProcessLock]]:
        """Those of ``locks`` (of processes of this node) whose process is dead."""
        ref: ray.ObjectRef[list[ProcessLock]] = self.actor.dead_processes.remote(list(locks))
        return ref

    # -- packing -----------------------------------------------------------------------
    def pack_chunks(
        self, source: Source, plans: Sequence[ChunkPlan]
    ) -> tuple[list[Ref], list[Ref]]:
        """One task packing ``plans``: the chunks' refs and their checksums' refs."""
        k = len(plans)
        refs = _refs(self.actor.pack_chunks.options(num_returns=2 * k).remote(source, plans), 2 * k)
        return refs[:k], refs[k:]

    def checksum_chunks(self, source: Source, plans: Sequence[ChunkPlan]) -> list[Ref]:
        """One task taking only the checksums of ``plans``' chunks (``streamed``)."""
        k = len(plans)
        return _refs(self.actor.checksum_chunks.options(num_returns=k).remote(source, plans), k)

    def store_chunks(
        self, source: Source, plans: Sequence[ChunkPlan]
    ) -> tuple[list[Ref], list[Ref]]:
        """One task storing ``plans``' chunks, mapped ones unhashed: the chunks' refs
        and their statuses' refs (checksum, None, or the packing error)."""
        k = len(plans)
        task = self.actor.store_chunks.options(num_returns=2 * k)
        refs = _refs(task.remote(source, plans), 2 * k)
        return refs[:k], refs[k:]

    def checksum_stored(self, chunks: Sequence[Ref]) -> list[Ref]:
        """One task hashing chunks already in the object store (their refs): the
        refs of their checksums, in order."""
        k = len(chunks)
        return _refs(self.actor.checksum_stored.options(num_returns=k).remote(*chunks), k)

    def pack_stream(self, source: Source, plans: Sequence[ChunkPlan]) -> tuple[Ref, list[Ref]]:
        """One task packing the whole (small) stream as one object, and the checksum
        of each of its chunks."""
        count = 1 + len(plans)
        refs = _refs(self.actor.pack_stream.options(num_returns=count).remote(source, plans), count)
        return refs[0], refs[1:]

    def packed(self, checksums: Sequence[Ref]) -> Ref:
        """A ref that resolves once every checksum has (a transfer's completion)."""
        ref: Ref = self.actor.packed.remote(*checksums)
        return ref

    def relayed(self, key: str, pid: int) -> Ref:
        """A ref, owned by this process, of the value ``relay(key, ...)`` hands over
        (``transfer.relay``); ``pid``: this process, whose exit ends the wait."""
        ref: Ref = self.actor.relayed.remote(key, pid)
        return ref

    def relay(self, key: str, value: Any) -> ray.ObjectRef[None]:
        """Hand over the value of ``relayed(key)`` (an exception: raised to readers)."""
        ref: ray.ObjectRef[None] = self.actor.relay.remote(key, value)
        return ref

    def relays_waiting(self) -> ray.ObjectRef[int]:
        ref: ray.ObjectRef[int] = self.actor.relays_waiting.remote()
        return ref

    def submit_transfer(
        self,
        source: Source,
        config: TransferConfig,
        registered: Any = None,
        requester: tuple[int, str] | None = None,
    ) -> ray.ObjectRef[list[Any]]:
        """Start a transfer owned by the agent (``owner="node"``), packed with the
        caller's strategy registrations and held for ``requester`` (a lease)."""
        ref: ray.ObjectRef[list[Any]] = self.actor.submit_transfer.remote(
            source, config, registered, requester
        )
        return ref

    def release(self, keys: Sequence[str]) -> ray.ObjectRef[None]:
        """Drop the leases ``keys`` (their requester references none of their refs)."""
        ref: ray.ObjectRef[None] = self.actor.release.remote(*keys)
        return ref

    def leases(self) -> ray.ObjectRef[dict[str, tuple[int, str] | None]]:
        ref: ray.ObjectRef[dict[str, tuple[int, str] | None]] = self.actor.leases.remote()
        return ref

    def stream(
        self,
        source: Source,
        files: Sequence[Entry],
        chunk_bytes: int,
        checksums: Sequence[Any],
        start: int,
        stop: int,
        verify: bool,
        stamps: Sequence[Stamp],
        window: int,
    ) -> Any:
        """Chunks ``start``..``stop - 1`` of ``source`` read now, as a streaming
        generator at most ``window`` chunks ahead of its reader (``streamed``)."""
        method = _ray.streaming(self.actor.stream, window)
        return method.remote(
            source, list(files), chunk_bytes, checksums, start, stop, verify, stamps
        )

    # -- node storage: checkpoints -----------------------------------------------------
    def store_checkpoint(self, checkpoint: Any, filesystem: pafs.FileSystem, path: str) -> Ref:
        """Write a transferred checkpoint (or its ref, resolved by Ray) to ``path``."""
        ref: Ref = self.actor.store_checkpoint.remote(checkpoint, filesystem, path)
        return ref

    def store_report(
        self, worker: str, source: Any, root: str, path: str, config: TransferConfig, op: str = ""
    ) -> ray.ObjectRef[str]:
        """Store Ray Train worker ``worker``'s report (a transfer's ref, resolved by
        Ray, or a directory on the storage node) at node-storage ``path``; ``op``:
        the replicated change it belongs to (``fence_ops``)."""
        ref: ray.ObjectRef[str] = self.actor.store_report.remote(
            worker, source, root, path, config, op
        )
        return ref

    def store_incremental(
        self,
        worker: str | None,
        root: str,
        path: str,
        source: Source,
        sender_node: str,
        files: ChunkedFiles,
        config: TransferConfig,
    ) -> ray.ObjectRef[dict[str, int]]:
        ref: ray.ObjectRef[dict[str, int]] = self.actor.store_incremental.remote(
            worker, root, path, source, sender_node, files, config
        )
        return ref

    def note_report_dir(self, root: str, worker: str, path: str) -> ray.ObjectRef[None]:
        """Make the directory Train worker ``worker`` writes a report into itself."""
        ref: ray.ObjectRef[None] = self.actor.note_report_dir.remote(root, worker, path)
        return ref

    def reclaim_reports(
        self, root: str, workers: list[str], tracked: list[str]
    ) -> ray.ObjectRef[list[str]]:
        """End the stopped ``workers``' reports and delete what Train does not track."""
        ref: ray.ObjectRef[list[str]] = self.actor.reclaim_reports.remote(root, workers, tracked)
        return ref

    def directory_transfer(self, root: str, path: str, config: TransferConfig) -> Ref:
        """A transfer of the node-storage directory ``path``, shared by readers:
        ``[checkpoint ref, lease]`` (nested, so the caller borrows the ref)."""
        ref: Ref = self.actor.directory_transfer.remote(root, path, config)
        return ref

    def release_directory_transfer(self, lease: str) -> ray.ObjectRef[None]:
        """The reader holding ``lease`` (from ``directory_transfer``) is done with it."""
        ref: ray.ObjectRef[None] = self.actor.release_directory_transfer.remote(lease)
        return ref

    def file_chunks(
        self, root: str, path: str, size: int, chunk_bytes: int, first: int, count: int, budget: int
    ) -> Ref:
        """``[[(chunk ref, checksum ref), ...]]`` of ``count`` chunks from ``first``."""
        ref: Ref = self.actor.file_chunks.remote(
            root, path, size, chunk_bytes, first, count, budget
        )
        return ref

    # -- node storage: metadata --------------------------------------------------------
    def fs_info(self, root: str, paths: list[str]) -> ray.ObjectRef[list[Info]]:
        ref: ray.ObjectRef[list[Info]] = self.actor.fs_info.remote(root, paths)
        return ref

    def fs_list(
        self, root: str, base: str, recursive: bool, allow_not_found: bool
    ) -> ray.ObjectRef[list[Listed]]:
        ref: ray.ObjectRef[list[Listed]] = self.actor.fs_list.remote(
            root, base, recursive, allow_not_found
        )
        return ref

    # The changes below take ``op``, the replicated change they belong to: an agent
    # refuses a call of one fenced off (``fence_ops``); '' for none.
    def fs_create_dir(
        self, root: str, path: str, recursive: bool, op: str = ""
    ) -> ray.ObjectRef[None]:
        ref: ray.ObjectRef[None] = self.actor.fs_create_dir.remote(root, path, recursive, op)
        return ref

    def fs_delete_dir(self, root: str, path: str, op: str = "") -> ray.ObjectRef[None]:
        ref: ray.ObjectRef[None] = self.actor.fs_delete_dir.remote(root, path, op)
        return ref

    def fs_delete_dir_contents(
        self, root: str, path: str, missing_dir_ok: bool, op: str = ""
    ) -> ray.ObjectRef[None]:
        ref: ray.ObjectRef[None] = self.actor.fs_delete_dir_contents.remote(
            root, path, missing_dir_ok, op
        )
        return ref

    def fs_delete_file(self, root: str, path: str, op: str = "") -> ray.ObjectRef[None]:
        ref: ray.ObjectRef[None] = self.actor.fs_delete_file.remote(root, path, op)
        return ref

    def fs_move(self, root: str, src: str, dest: str, op: str = "") -> ray.ObjectRef[None]:
        ref: ray.ObjectRef[None] = self.actor.fs_move.remote(root, src, dest, op)
        return ref

    # -- node storage: replicas --------------------------------------------------------
    def claim_copy(
        self, root: str, storage: str, node: str, members: list[str], taken: list[str], adopt: bool
    ) -> ray.ObjectRef[bool]:
        """Make ``root`` the copy of ``storage`` on ``node`` (its marker); whether
        it held anything. ValueError if it is another copy's or holds foreign files."""
        ref: ray.ObjectRef[bool] = self.actor.claim_copy.remote(
            root, storage, node, members, taken, adopt
        )
        return ref

    def fence_ops(self, ops: list[str], timeout_s: float) -> ray.ObjectRef[list[str]]:
        """Refuse every later call of ``ops``; those still running after ``timeout_s``."""
        ref: ray.ObjectRef[list[str]] = self.actor.fence_ops.remote(ops, timeout_s)
        return ref

    def fs_copy_file(self, root: str, src: str, dest: str, op: str = "") -> ray.ObjectRef[None]:
        ref: ray.ObjectRef[None] = self.actor.fs_copy_file.remote(root, src, dest, op)
        return ref

    # -- node storage: the durable tier -------------------------------------------------
    def durable_attach(
        self, root: str, target: Any, settings: Any, replica: tuple[str, str] | None = None
    ) -> ray.ObjectRef[str]:
        """Drain ``root`` into the durable tier ``target`` (a ``DurableTarget``) from
        this agent with ``settings`` (``DrainSettings``); ``replica``: the replicated
        storage's key and storage node, whose copy ``root`` is. The drain's epoch."""
        ref: ray.ObjectRef[str] = self.actor.durable_attach.remote(root, target, settings, replica)
        return ref

    def durable_request(self, root: str) -> ray.ObjectRef[tuple[str, int]]:
        """``(epoch, ticket)``: the ticket is completed by the next pass to end well."""
        ref: ray.ObjectRef[tuple[str, int]] = self.actor.durable_request.remote(root)
        return ref

    def durable_status(self, root: str, path: str | None = None) -> ray.ObjectRef[Any]:
        """The drain's ``DrainStatus`` (of ``path`` too, if given)."""
        ref: ray.ObjectRef[Any] = self.actor.durable_status.remote(root, path)
        return ref

    def durable_locate(self, root: str, path: str) -> ray.ObjectRef[tuple[Info, bool]]:
        """What ``path`` is, and whether node storage (not the durable tier) holds it."""
        ref: ray.ObjectRef[tuple[Info, bool]] = self.actor.durable_locate.remote(root, path)
        return ref

    # -- node storage: uploads ---------------------------------------------------------
    def fs_open_write(
        self, root: str, path: str, append: bool, writer: Process | None = None
    ) -> ray.ObjectRef[tuple[str, int, Expect]]:
        """Staging for a new version of ``path``: ``(staging, start offset, expect)``;
        discarded if ``writer`` dies before it commits."""
        ref: ray.ObjectRef[tuple[str, int, Expect]] = self.actor.fs_open_write.remote(
            root, path, append, writer
        )
        return ref

    def fs_write(
        self,
        root: str,
        staging: str,
        offset: int,
        data: Any,
        checksum: str,
        direct_io: bool = False,
    ) -> ray.ObjectRef[None]:
        ref: ray.ObjectRef[None] = self.actor.fs_write.remote(
            root, staging, offset, data, checksum, direct_io
        )
        return ref

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
    ) -> ray.ObjectRef[None]:
        ref: ray.ObjectRef[None] = self.actor.fs_commit.remote(
            root, path, staging, offset, tail, checksum, size, direct_io, expect, op
        )
        return ref

    def fs_write_or_reuse(
        self,
        root: str,
        staging: str,
        offset: int,
        checksum: str,
        length: int,
        sent: list[Any],
        direct_io: bool = False,
    ) -> ray.ObjectRef[bool]:
        """Whether the chunk was copied from the storage node's disk (else fetched
        through ``sent``, ``[ref]``)."""
        ref: ray.ObjectRef[bool] = self.actor.fs_write_or_reuse.remote(
            root, staging, offset, checksum, length, sent, direct_io
        )
        return ref

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
    ) -> ray.ObjectRef[None]:
        ref: ray.ObjectRef[None] = self.actor.fs_commit_indexed.remote(
            root, path, staging, offset, tail, checksum, size, sums, chunk_bytes, direct_io, expect
        )
        return ref

    def fs_abort(self, root: str, staging: str) -> ray.ObjectRef[None]:
        ref: ray.ObjectRef[None] = self.actor.fs_abort.remote(root, staging)
        return ref
