"""Node storage, what a storage node's agent answers: one ``Protocol`` per service,
declared below both rooms (the caller's side calls it, the storage node's side,
``storage.server``, implements it), so that neither imports the other.

A caller names a method here and its arguments (``link.call(NodeMetadata.fs_info,
root, paths)``): mypy checks them against the one signature written here, which the
server's class, a subclass, must keep (``cluster.rpc``). Paths are confined to the
root the caller names. An upload's commit travels as one value (``Commit``,
``IndexedCommit``), its arguments written once.

A call that changes what ``root`` holds is declared a ``change``: the storage node
runs each fenced by its ``op`` (the replicated change it belongs to: an agent
refuses a call of one fenced off, ``fence_ops``; '' for none) and then wakes the
durable tier's drain of ``root`` (``storage.server.changes``), for all of them in
one place, so that a change can forget neither. A call that takes an ``op`` and is
not declared a change is refused when the agent starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import pyarrow.fs as pafs

from air_transfer.cluster.refs import ChecksumRef, ChunkRef
from air_transfer.config import TransferConfig
from air_transfer.core.file_chunks import ChunkedFiles
from air_transfer.core.process_locks import Process
from air_transfer.core.scan import Source
from air_transfer.storage.durable.records import FileRecord
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.status import DrainStatus
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.node_wire import Expect, Info, Listed, PlacedSend

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

F = TypeVar("F", bound=Callable[..., Any])
#: The replicated storage a drain's root is a copy of: its key and its storage node.
ReplicaOf = tuple[str, str]
_CHANGE = "__air_transfer_change__"


def change(method: F) -> F:
    """Declare ``method`` a call that changes what node storage ``root`` holds (see
    the module): fenced by its ``op``, if it takes one, and the drain woken after."""
    setattr(method, _CHANGE, True)
    return method


def is_change(method: Callable[..., Any]) -> bool:
    return bool(getattr(method, _CHANGE, False))


@dataclass(frozen=True)
class ChunkAt:
    """Where a chunk is written: at ``offset`` of the staging file ``staging``, around
    the page cache with ``direct_io``. The chunk and its checksum travel beside it,
    as arguments of their own (Ray resolves a ref only there)."""

    staging: str
    offset: int
    direct_io: bool = False


@dataclass(frozen=True)
class Commit:
    """What an upload's commit says: write ``tail`` (the last bytes, ``checksum``
    theirs) at ``offset`` of the staging file ``staging`` (around the page cache with
    ``direct_io``), check that it then holds ``size`` bytes and rename it over
    ``path``; ``expect``: what an append expects to find there (``fs_open_write``'s);
    ``placed``: the file is a placed file's stub, marked so on the storage node
    (``core.placed_mark``: never by its bytes). Made by the caller, unpickled as
    sent (no ``__init__`` runs there): the storage node checks each field where it
    uses it, as it would an argument."""

    path: str
    staging: str
    offset: int
    tail: Buffer
    checksum: str
    size: int
    direct_io: bool = False
    expect: Expect = None
    placed: bool = False


@dataclass(frozen=True)
class IndexedCommit(Commit):
    """A ``Commit`` of an incremental upload, whose file is then indexed by its
    chunks of ``chunk_bytes``: ``sums``, their checksums (one per chunk, the tail's
    too). Both are given by name, after the ``Commit``'s fields."""

    sums: tuple[str, ...] = field(kw_only=True)
    chunk_bytes: int = field(kw_only=True)


@dataclass(frozen=True)
class SenderOffer:
    """What the sender of an incremental upload offers before sending any byte: the
    checkpoint ``files`` describes, its bytes to be fetched from ``source`` on the
    node ``node`` (only those the storage node does not hold)."""

    source: Source
    node: str
    files: ChunkedFiles


class NodeMetadata(Protocol):
    """Files and directories, what is there and what changes: in node storage, else
    in the durable tier behind it (``storage.server.drain.tiered``)."""

    def fs_info(self, root: str, paths: list[str]) -> list[Info]: ...

    def fs_list(
        self, root: str, base: str, recursive: bool, allow_not_found: bool
    ) -> list[Listed]: ...

    @change
    def fs_create_dir(self, root: str, path: str, recursive: bool, op: str = "") -> None: ...

    @change
    def fs_delete_dir(self, root: str, path: str, op: str = "") -> None: ...

    @change
    def fs_delete_dir_contents(
        self, root: str, path: str, missing_dir_ok: bool, op: str = ""
    ) -> None: ...

    @change
    def fs_delete_file(self, root: str, path: str, op: str = "") -> None: ...

    @change
    def fs_move(self, root: str, src: str, dest: str, op: str = "") -> None: ...


class NodeFiles(Protocol):
    """Uploads (staged, then committed whole) and copies of files."""

    @change
    def fs_copy_file(self, root: str, src: str, dest: str, op: str = "") -> None: ...

    def fs_open_write(
        self, root: str, path: str, append: bool, writer: Process | None = None
    ) -> tuple[str, int, Expect]:
        """Staging for a new version of ``path``: ``(staging, start offset, expect)``;
        discarded if ``writer`` dies before it commits."""
        ...

    def fs_write(self, root: str, into: ChunkAt, data: Buffer | ChunkRef, checksum: str) -> None:
        """Write ``data`` (a chunk, or its ref: Ray resolves it before the call) where
        ``at`` says, checked against ``checksum``."""
        ...

    @change
    def fs_commit(self, root: str, commit: Commit, op: str = "") -> None: ...

    def fs_abort(self, root: str, staging: str) -> None: ...

    @change
    def fs_swap_stub(self, root: str, path: str, expect: bytes, head: bytes, op: str = "") -> None:
        """Give the placed file's stub ``path``, which must still begin with the
        record ``expect``, the record ``head`` instead (its holders repaired); ESTALE
        if it is no longer that stub."""
        ...


class NodeCopies(Protocol):
    """What makes a directory a replicated storage's copy, and the fence of the
    changes of an operation resolved without its caller."""

    def claim_copy(
        self, root: str, storage: str, node: str, members: list[str], taken: list[str], adopt: bool
    ) -> bool:
        """Make ``root`` the copy of ``storage`` on ``node`` (its marker); whether it
        held anything. ValueError if it is another copy's or holds foreign files."""
        ...

    def fence_ops(self, ops: list[str], timeout_s: float) -> list[str]:
        """Refuse every later call of ``ops``; those still running after ``timeout_s``."""
        ...


class NodeIndexedUploads(Protocol):
    """Uploads of an incremental node storage: chunks a stored file holds are copied
    on the storage node, and the committed file's chunks are indexed for later ones."""

    def fs_write_or_reuse(
        self, root: str, into: ChunkAt, checksum: str, length: int, sent: list[ChunkRef]
    ) -> bool:
        """Whether the chunk was copied from the storage node's disk (else fetched
        through ``sent``, ``[ref]``)."""
        ...

    @change
    def fs_commit_indexed(self, root: str, commit: IndexedCommit) -> None: ...


class NodeReads(Protocol):
    """File bodies and whole directories, read as chunks in the object store."""

    def file_chunks(
        self, root: str, path: str, size: int, chunk_bytes: int, first: int, count: int, budget: int
    ) -> list[list[tuple[ChunkRef, ChecksumRef]]]:
        """``[[(chunk ref, checksum ref), ...]]`` of ``count`` chunks from ``first``."""
        ...

    def disk_read(
        self, root: str, path: str, size: int, chunk_bytes: int, first: int
    ) -> Iterator[np.ndarray]: ...

    def placed_head(self, root: str, path: str, nbytes: int) -> tuple[int, bytes] | None:
        """``(size, first nbytes)`` of ``path`` if it is a placed file's stub (marked
        so by the storage node, ``core.placed_mark``); None for any other file or a
        directory; FileNotFoundError if there is none."""
        ...

    def directory_transfer(
        self, root: str, path: str, config: TransferConfig, node: str | None = None
    ) -> list[Any]:
        """A transfer of the directory ``path``, shared by readers: ``[checkpoint ref,
        lease, relayed]`` (nested, so the caller borrows the ref); the lease goes back
        to ``release_directory_transfer`` when the reader is done. For a reader on
        ``node`` while a reader on another node reads it, the ref is of its relay
        (``relayed``: copies of its chunks on that other node, ``transfer.fanout``);
        ``node`` None: never a relay."""
        ...

    def release_directory_transfer(self, lease: str) -> None: ...


class NodeCheckpoints(Protocol):
    """Checkpoints written into node storage by the storage node itself."""

    def store_checkpoint(self, checkpoint: object, filesystem: pafs.FileSystem, path: str) -> str:
        """Write a transferred checkpoint (a ``ChunkedCheckpoint`` or its handle, or
        its ref, resolved by Ray) to ``path`` on ``filesystem``."""
        ...

    @change
    def store_report(
        self, worker: str, src: object, root: str, path: str, config: TransferConfig, op: str = ""
    ) -> str:
        """Store Ray Train worker ``worker``'s reported checkpoint ``src`` (a transfer's ref,
        resolved by Ray, or a directory on the storage node) at ``path``. Noted until
        Train stops the worker's group (``reclaim_reports``)."""
        ...

    @change
    def store_incremental(
        self, worker: str | None, root: str, path: str, offer: SenderOffer, config: TransferConfig
    ) -> dict[str, int]:
        """Store the checkpoint ``offer`` describes at ``path`` from what the storage
        node holds, fetching the rest from the sender; what it cost. A Ray Train
        report (``worker`` given) is noted as ``store_report``'s."""
        ...

    @change
    def note_report_dir(self, root: str, worker: str, path: str) -> None:
        """Make the directory ``path`` that Ray Train worker ``worker`` writes its
        report into itself (torch DCP), noted as ``store_report``'s are."""

    @change
    def reclaim_reports(self, root: str, workers: list[str], tracked: list[str]) -> list[str]:
        """Ray Train is stopping the group of ``workers``: end their reports still
        being stored and delete what they stored that Train does not track."""
        ...

    @change
    def reclaim_placed_reports(
        self, root: str, workers: list[str], tracked: list[str], nbytes: int
    ) -> tuple[list[str], list[tuple[str, int, bytes]]]:
        """``reclaim_reports`` of a writer-placed storage: also ``(path, size, first
        nbytes)`` of each placed file's stub it deleted, whose holders' bytes the
        caller then deletes."""
        ...


class NodeDurable(Protocol):
    """The durable tier behind a node storage root (its drain and its reads)."""

    def durable_attach(
        self, root: str, target: DurableTarget, settings: DrainSettings, replica: ReplicaOf | None
    ) -> str:
        """Drain ``root`` into ``target`` from this agent with ``settings``;
        ``replica``: the replicated storage's key and storage node, whose copy
        ``root`` is. The drain's epoch."""
        ...

    def durable_request(self, root: str, confirm: bool = False) -> tuple[str, int]:
        """``(epoch, ticket)``: the ticket is completed by the next pass to end well
        (with ``confirm``: one that confirmed everything in the tier first)."""
        ...

    def durable_status(
        self, root: str, path: str | None = None, confirm: bool = False
    ) -> DrainStatus:
        """The drain's ``DrainStatus`` (of ``path`` too, if given; asked of the tier
        itself with ``confirm``)."""
        ...

    def durable_locate(self, root: str, path: str) -> tuple[Info, bool, FileRecord | None]:
        """What ``path`` is, whether node storage (not the durable tier) holds it, and
        the tier's record of it where only the tier does."""
        ...

    def durable_admit(self, root: str, nbytes: int) -> str | None:
        """Room for a report of ``nbytes`` within ``max_lag_bytes``: a reservation's
        key (give it back with ``durable_release``), or None: not yet."""
        ...

    def durable_release(self, root: str, key: str) -> None: ...

    def durable_whole(self, root: str, path: str) -> tuple[bool, str]:
        """Whether the tier holds ``path`` whole now, and if not, what is wrong."""
        ...


class NodePlacedSends(Protocol):
    """A holder's part in the durable drain of a writer-placed storage: what the
    storage node's drain asks of a node that holds a placed file's bytes, so that
    they go to the tier from where they are, never through the storage node."""

    def placed_sums_bytes(self, root: str, path: str) -> bytes:
        """The checksum list at ``path`` (beside a blob) under this node's placed root
        ``root``, as it is on disk: the caller checks it against the file's record."""
        ...

    def placed_send(
        self, root: str, send: PlacedSend, target: DurableTarget, settings: DrainSettings
    ) -> FileRecord:
        """Upload ``send``'s blob, under this node's placed root ``root``, to its path
        in ``target`` as ``settings`` say (codec, parts, rate), each chunk checked
        against ``send.record`` before it leaves the node; the record of what was
        stored, with the tier's tag, which the caller confirms itself."""
        ...
