"""Transfer knobs in one frozen, validated place (torchsnapshot keeps its in ``knobs.py``).

A bad value fails when the config is built, naming the field, the value and the limit,
instead of surfacing later as an odd failure deep in a transfer.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    from typing_extensions import Self  # typing.Self from Python 3.11

#: A durable tier as given: a URI, or a ``(pyarrow.fs.FileSystem, path)`` pair.
Durable = str | tuple["pafs.FileSystem", str]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: Smallest chunk accepted: below this the per-object overhead of the Ray object
#: store dominates and a checkpoint turns into millions of objects.
MIN_CHUNK_BYTES = 1 * KiB
#: Largest chunk accepted: each chunk is one buffer in process memory while it is
#: read or written, so this bounds private memory per in-flight chunk.
MAX_CHUNK_BYTES = 2 * GiB
#: Up to this size a checkpoint travels as one object: per-chunk overhead would
#: dominate, and one put/get is the lowest latency.
DEFAULT_INLINE_MAX_BYTES = 8 * MiB
OWNERS = ("caller", "node")


class _Replaceable:
    """``replace``, written once for the frozen configs below (each a dataclass that
    validates itself in ``__post_init__``)."""

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` applied and validated again.

        Returns:
            The new settings (this object is frozen).

        Raises:
            ValueError: A changed field is out of its range (the message names it).
        """
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class TransferConfig(_Replaceable):
    """How a checkpoint is cut, carried and checked.

    Attributes:
        chunk_bytes: size of one chunk of the file byte stream. Producer and consumer
            memory is bounded by a few chunks, whatever the checkpoint size.
        inline_max_bytes: checkpoints of at most this many bytes travel as a single
            object (strategy ``inline``); it must fit in ``window * chunk_bytes`` so
            that even the inline path keeps the memory bound.
        window: how many chunks the reader fetches ahead of the one being written.
        strategy: a registered strategy name that overrides size-based selection.
        verify: check every chunk against its manifest checksum when unpacking.
        follow_symlinks: pack the target of a symlink that leaves the checkpoint
            instead of refusing it.
        owner: who owns the chunks. ``"caller"`` (like ``ray.put``): the process that
            packs; they die with it. ``"node"``: the long-lived agent actor of the
            caller's node, so the checkpoint outlives the worker that made it.
        direct_io: the reader writes files of 16 MiB or more with ``O_DIRECT``,
            around the page cache, where the filesystem supports it: steady disk
            speed instead of dirty-page throttling; node storage so writes uploaded
            chunks of 16 MiB or more. False: everything through the page cache.
        cache_bytes: node storage (``storage_filesystem``): the storage node keeps the
            chunks of files read from it in its object store, up to this many bytes
            (least recently used first out, and after 30 s unused), so N readers of
            one checkpoint read it from disk once and Ray may serve them from any
            node holding a copy. 0: none kept beyond the read that asked. A
            checkpoint directory restored by readers at the same time is shared by
            all of them whatever its size; this bounds what is kept once they are done.
            The storage node keeps at most a quarter of its object store, whatever
            this says: a cache filling the store would make Ray spill its chunks.
        incremental: node storage (``storage_filesystem``, ``checkpoint_upload_fn``):
            a checkpoint directory stored there first sends a checksum per chunk of
            each file (cut every ``chunk_bytes`` from each file's start); the storage
            node reuses what earlier checkpoints under the same root hold (proven
            against the bytes on disk; a whole file cloned or hard-linked, so stored
            once) and only the other chunks travel.
        reuse_chunks: with ``owner="node"``: a transfer takes the chunk objects of
            earlier transfers from this node that the agent still holds (their
            requesters still reference them) wherever they were packed from files
            unchanged since (equal scan stamps: size, mtime, ctime, inode), instead of
            packing them again; only the ``chunked`` strategy and local files. Both
            transfers must ask for it (what is recorded costs a little per chunk).
        progress: show a progress bar (bytes, rate, ETA) for each transfer that runs
            longer than a second: packing (``to_object_ref``, ``to_object_ref_async``)
            and reading (``to_directory``). ``True`` or ``False`` decides; ``None``
            (default) leaves it to the environment variable ``AIR_TRANSFER_PROGRESS``
            (``1``/``0``, for Train workers), and without it to whether this process's
            stderr is a terminal (so on in an interactive driver, off in Ray workers
            and batch jobs). Inside a Ray worker bars go through Ray's ``tqdm_ray`` and
            are drawn by the driver. Readers use the config the checkpoint was packed
            with. It changes nothing about the transfer, so it takes no part in
            comparing configs (``to_object_ref`` of a transferred checkpoint with a
            config that differs only here re-shares it without repacking).
    """

    chunk_bytes: int = 32 * MiB
    inline_max_bytes: int | None = None
    window: int = 4
    strategy: str | None = None
    verify: bool = True
    follow_symlinks: bool = False
    owner: Literal["caller", "node"] = "caller"
    direct_io: bool = True
    cache_bytes: int = 1 * GiB
    incremental: bool = False
    reuse_chunks: bool = False
    progress: bool | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        _require_int(self, "chunk_bytes", MIN_CHUNK_BYTES, MAX_CHUNK_BYTES)
        _require_int(self, "window", 1, 1024)
        _require_int(self, "cache_bytes", 0, 1 << 62)
        if self.inline_max_bytes is not None:
            _require_int(
                self,
                "inline_max_bytes",
                0,
                self.window * self.chunk_bytes,
                limit_name="window * chunk_bytes",
            )
        if self.strategy is not None and (not isinstance(self.strategy, str) or not self.strategy):
            raise ValueError(
                f"TransferConfig.strategy must be a registered strategy name or None, "
                f"got {self.strategy!r}"
            )
        if self.owner not in OWNERS:
            raise ValueError(
                f"TransferConfig.owner must be one of {', '.join(map(repr, OWNERS))}, "
                f"got {self.owner!r}"
            )
        for flag in ("verify", "follow_symlinks", "direct_io", "incremental", "reuse_chunks"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(
                    f"TransferConfig.{flag} must be a bool, got {getattr(self, flag)!r}"
                )
        if self.reuse_chunks and self.owner != "node":
            raise ValueError(
                "TransferConfig.reuse_chunks=True needs owner='node': only the node's "
                f"agent holds chunks for later transfers, got owner={self.owner!r}"
            )
        if self.progress is not None and not isinstance(self.progress, bool):
            raise TypeError(
                f"TransferConfig.progress must be True, False or None (automatic), "
                f"got {self.progress!r}"
            )

    @property
    def inline_limit(self) -> int:
        """The effective ``inline_max_bytes`` (its default resolved)."""
        if self.inline_max_bytes is not None:
            return self.inline_max_bytes
        return min(DEFAULT_INLINE_MAX_BYTES, self.window * self.chunk_bytes)


def _require_int(
    config: object, name: str, low: int, high: int, limit_name: str | None = None
) -> None:
    """``config.name`` an int in ``[low, high]`` (``high`` named ``limit_name``)."""
    owner, value = type(config).__name__, getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{name} must be an int, got {value!r}")
    if not low <= value <= high:
        upper = f"{limit_name} = {high}" if limit_name else str(high)
        raise ValueError(f"{owner}.{name} = {value} is outside the allowed range [{low}, {upper}]")


def _require_strs(config: object, name: str, what: str) -> None:
    """``config.name`` a tuple of non-empty strings (``what`` they are)."""
    value = getattr(config, name)
    if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
        raise TypeError(f"{type(config).__name__}.{name} must be a tuple of {what}, got {value!r}")


_USERINFO = re.compile(r"([a-zA-Z][\w+.-]*://[^:/@?\s]*):[^?\s]*@")


def redacted(text: str, uri: str | None = None) -> str:
    """``text`` without the secret of any ``scheme://user:secret@`` in it, nor the
    secret of ``uri`` (or its percent-decoded form) wherever it appears: how a
    durable tier's URI is shown in reprs, errors and logs."""
    out = _USERINFO.sub(r"\1:***@", text)
    found = re.match(r"[a-zA-Z][\w+.-]*://[^:/@?\s]*:([^?\s]*)@", uri or "")
    if found is not None and found.group(1):
        for secret in sorted({found.group(1), unquote(found.group(1))}, key=len, reverse=True):
            out = out.replace(secret, "***")
    return out


#: Files the durable tier receives after the rest of a drain pass: the ones that make
#: a checkpoint whole (torch DCP writes ``.metadata`` last) or that name checkpoints
#: (Ray Train's run state, Ray Tune's experiment state).
DURABLE_LAST = (
    ".metadata",
    "checkpoint_manager_snapshot.json",
    "experiment_state-*.json",
    "tuner.pkl",
    "trainer.pkl",
)


#: Ray's label of a node's availability zone (``StorageConfig.failure_domain``).
ZONE_LABEL = "ray.io/availability-zone"


@dataclass(frozen=True)
class StorageConfig(_Replaceable):
    """How node storage (``storage_filesystem``) keeps its files: on how many nodes,
    whether incrementally, how much it caches for readers, and the durable tier it
    feeds in the background. Frozen and validated like ``TransferConfig``.

    Attributes:
        replicas: every file on this many distinct nodes (1: the storage node only).
        replica_nodes: nodes to hold the copies first (node ids, IP addresses or
            "head", as ``storage_filesystem(node=)`` takes them).
        replica_root: each copy's root, ``{node_id}`` formatted in (nodes sharing one
            disk); default: ``root`` on every node.
        placement: where a file's bytes live: ``"storage"`` (on the storage node and
            its copies, as every other file) or ``"writer"`` (on the node of the
            process that wrote it and ``replicas - 1`` other nodes, under
            ``replica_root`` formatted with ``"<node id>.placed"``; the storage node
            and its copies keep the names, directories, small files and where each
            large file's bytes live). ``"writer"`` needs ``replicas >= 2``, a
            ``replica_root`` with ``{node_id}``.
        failure_domain: the node label naming a node's failure domain (default Ray's
            zone, ``ZONE_LABEL``): with ``placement="writer"``, a file's holders span
            every live domain before one holds two. None: nodes only.
        incremental: a checkpoint stored there sends and stores only the chunks that
            earlier checkpoints under the root lack (with ``placement="writer"``:
            that the blobs each holder holds lack).
        cache_bytes: chunks of files read from node storage kept for N readers
            (at most a quarter of the storage node's object store).
        durable: the durable tier: a URI ``pyarrow.fs.FileSystem.from_uri`` accepts
            (``s3://bucket/prefix?endpoint_override=...``, ``gs://...``,
            ``file:///mnt/nfs/...``) or a ``(pyarrow.fs.FileSystem, path)`` pair; a
            path ``root/p`` of node storage is ``path/p`` there. None: no durable tier.
        durable_concurrency: files uploaded at once.
        durable_bytes_per_s: cap on the upload rate (None: none).
        max_lag_bytes: a report waits while more than this many bytes of node storage
            are not yet in the durable tier (None: never waits).
        durable_last: name patterns of the files uploaded after the rest of a pass.
        durable_scrub_s: how often everything counted durable is confirmed in the
            tier again (its size and version, one request a file; what was lost is
            uploaded again); None: only when ``wait_durable`` asks.
        durable_scrub_bytes_per_s: besides, read every stored byte back and check
            it against its checksums at this rate (None: never).
        durable_read_wait_s: how long a read that the durable tier alone can answer
            waits for an endpoint that does not answer, before it raises.
        durable_part_bytes: the smallest part of an S3 upload (larger where a file
            needs more than S3's 10,000 parts).
        durable_codec: how the durable tier stores files: ``identity`` (plain files)
            or ``bytegroup-zstd`` (a third fewer bytes on bf16 weights; the
            ``[codec]`` extra).
    """

    replicas: int = 1
    replica_nodes: tuple[str, ...] = ()
    replica_root: str | None = None
    placement: str = "storage"
    failure_domain: str | None = ZONE_LABEL
    incremental: bool = False
    cache_bytes: int = 1 * GiB
    durable: Durable | None = None
    durable_concurrency: int = 4
    durable_bytes_per_s: int | None = None
    max_lag_bytes: int | None = None
    durable_last: tuple[str, ...] = DURABLE_LAST
    durable_scrub_s: float | None = 3600.0
    durable_scrub_bytes_per_s: int | None = None
    durable_read_wait_s: float = 30.0
    durable_part_bytes: int = 32 * 1024 * 1024
    durable_codec: str = "identity"

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{f.name}={redacted(getattr(self, f.name))!r}"
            if f.name == "durable" and isinstance(getattr(self, f.name), str)
            else f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
        )
        return f"StorageConfig({fields})"

    def __post_init__(self) -> None:
        replicas = self.replicas
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 64:
            raise ValueError(f"replicas must be an int >= 1 (at most 64), got {replicas!r}")
        _require_int(self, "cache_bytes", 0, 1 << 62)
        _require_int(self, "durable_concurrency", 1, 256)
        for name in ("durable_bytes_per_s", "max_lag_bytes"):
            if getattr(self, name) is not None:
                _require_int(self, name, 1, 1 << 62)
        if not isinstance(self.incremental, bool):
            raise TypeError(f"StorageConfig.incremental must be a bool, got {self.incremental!r}")
        _require_strs(self, "replica_nodes", "node ids")
        domain = self.failure_domain
        if domain is not None and not (isinstance(domain, str) and domain.strip()):
            raise ValueError(
                f"StorageConfig.failure_domain must be a node label's key (or None), got {domain!r}"
            )
        if self.replica_root is not None and not isinstance(self.replica_root, str):
            raise TypeError(f"StorageConfig.replica_root must be a str, got {self.replica_root!r}")
        self._check_placement()
        if self.durable is not None and not isinstance(self.durable, (str, tuple)):
            raise TypeError(
                "StorageConfig.durable must be a URI or a (pyarrow.fs.FileSystem, path) "
                f"pair, got {type(self.durable).__name__}"
            )
        _require_strs(self, "durable_last", "name patterns")

    def _check_placement(self) -> None:
        """``placement`` one of ``PLACEMENTS``, and ``"writer"`` only with what it is
        built for (the rest refused here, by name, rather than done wrong)."""
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"StorageConfig.placement must be one of {PLACEMENTS}, got {self.placement!r}"
            )
        if self.placement != "writer":
            return
        refused = [
            (self.replicas < 2, f"replicas >= 2 (got replicas={self.replicas}): a file's "
             "bytes on its writer's node alone would be lost with that node"),
            (self.replica_root is None or "{node_id}" not in self.replica_root,
             f"a replica_root with '{{node_id}}' in it (got {self.replica_root!r}): each "
             "node keeps the bytes it holds under replica_root formatted with "
             "'<node id>.placed'"),
        ]  # fmt: skip
        for wrong, needs in refused:
            if wrong:
                raise ValueError(f"StorageConfig.placement='writer' needs {needs}")


#: Where node storage keeps a file's bytes (``StorageConfig.placement``).
PLACEMENTS = ("storage", "writer")
