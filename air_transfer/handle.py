"""A packed checkpoint in transit: manifest + strategy + payload, and the packing step
that makes one.

This is what ``ChunkedCheckpoint.to_object_ref`` puts in the object store and what a
transferred checkpoint pickles as: a few KB of manifest plus the payload's
ObjectRefs, never the bytes themselves (Ray keeps refs nested in a put object alive
for as long as that object is referenced).
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ObjectLostError, RayActorError

from air_transfer import _ray
from air_transfer.config import TransferConfig
from air_transfer.errors import CheckpointLostError
from air_transfer.layout import Source, scan
from air_transfer.manifest import Manifest
from air_transfer.nodes import node_agent, running_in_agent, this_node_id
from air_transfer.reader import ChunkFileReader, buffered
from air_transfer.strategies import TransferStrategy, get_strategy, select_strategy
from air_transfer.writer import check_chunk, write_tree


@dataclass(frozen=True, eq=False)
class TransferHandle:
    """Everything a reader anywhere in the cluster needs to rebuild the checkpoint."""

    manifest: Manifest
    strategy: TransferStrategy
    payload: Any
    config: TransferConfig
    owner: str
    transfer_id: str

    def iter_chunks(self, start: int = 0, stop: int | None = None) -> Iterator[Any]:
        """Chunks ``start``..``stop - 1`` in order as the strategy delivers them
        (unverified); a lost chunk raises CheckpointLostError."""
        stop = self.manifest.num_chunks if stop is None else stop
        index = start
        try:
            for chunk in self.strategy.iter_chunks(
                self.payload, self.manifest, start, stop, self.config
            ):
                yield chunk
                index += 1
        except (ObjectLostError, RayActorError) as e:
            raise lost_error(self, f"chunk {index} of {self.manifest.num_chunks}", e) from e

    def verified_chunks(self, start: int, stop: int) -> Iterator[tuple[int, memoryview]]:
        """``(index, view)`` for chunks ``start``..``stop - 1``, each checked."""
        for index, chunk in enumerate(self.iter_chunks(start, stop), start):
            view = memoryview(chunk).cast("B")
            check_chunk(self.manifest, index, view, self.config.verify)
            yield index, view

    def write_to(self, target: str | os.PathLike[str]) -> str:
        """Rebuild the checkpoint at ``target``: published only once complete and
        verified; merged into an existing directory, whose merged tree replaces it in
        one step."""
        return write_tree(
            self.manifest, self.iter_chunks(), target, self.config.verify, self.config.direct_io
        )

    def open_file(self, relpath: str) -> io.BufferedReader:
        """A seekable binary stream over one file, fetching only its chunks."""
        entry = self.manifest.entry(relpath)
        if entry.kind != "file":
            raise IsADirectoryError(f"{relpath!r} is a {entry.kind} in this checkpoint")
        offset = self.manifest.stream_offset(entry.path)
        cb = self.manifest.chunk_bytes
        last = (offset + entry.size - 1) // cb + 1 if entry.size else 0

        def open_chunks(first: int) -> Iterator[tuple[int, memoryview]]:
            return self.verified_chunks(first, max(last, first))

        raw = ChunkFileReader(entry.path, entry.size, offset, cb, open_chunks)
        return buffered(raw, cb)

    def describe(self) -> str:
        m = self.manifest
        n_files = sum(1 for _ in m.files())
        return (
            f"strategy={self.strategy.name!r}, files={n_files}, bytes={m.total_bytes}, "
            f"chunks={m.num_chunks}"
        )


def pack_to_ref(source: Source, config: TransferConfig | None = None) -> ray.ObjectRef:
    """Pack ``source`` and return an ObjectRef to the handle, owned (with the chunks)
    by this process or, for ``owner="node"``, by this node's agent."""
    config = config or TransferConfig()
    if config.owner == "node" and not running_in_agent():
        [ref] = ray.get(node_agent().pack.remote(source, config))
        return ref
    return ray.put(pack(source, config))


def pack(source: Source, config: TransferConfig | None = None) -> TransferHandle:
    """Scan ``source``, pick a strategy (``config.strategy``, else by size against
    the free object store), and pack in this process."""
    config = config or TransferConfig()
    scanned = scan(source, follow_symlinks=config.follow_symlinks)
    total = sum(f.size for f in scanned.files)
    store_free = _ray.object_store_free_bytes(this_node_id())
    strategy = get_strategy(select_strategy(total, config, store_free))()
    # The strategy proves every byte it reads against the scan's stamps, so the
    # manifest's sizes and mtimes are those of the bytes packed.
    packed = strategy.pack(source, scanned.files, scanned.stamps, config)
    manifest = Manifest(
        entries=scanned.entries, chunk_bytes=config.chunk_bytes, chunks=packed.checksums
    )
    return TransferHandle(
        manifest=manifest,
        strategy=strategy,
        payload=packed.payload,
        config=config,
        owner=describe_current_process(),
        transfer_id=uuid.uuid4().hex,
    )


def describe_current_process() -> str:
    """Who owns what this process puts: named in CheckpointLostError messages."""
    ctx = ray.get_runtime_context()
    if ctx.get_actor_id():
        role = f"actor {ctx.get_actor_name() or ctx.get_actor_id()[:12]}"
    elif ctx.worker.mode == ray.SCRIPT_MODE:
        role = "the driver"
    else:
        role = f"task {ctx.get_task_function_name() or '?'}"
    worker, node = ctx.get_worker_id()[:12], ctx.get_node_id()[:12]
    return f"{role} (worker {worker}, pid {os.getpid()}, node {node})"


def lost_error(
    handle: TransferHandle | None, what: str, cause: BaseException
) -> CheckpointLostError:
    """The CheckpointLostError for ``what`` (a chunk, the handle) being unfetchable."""
    owner = handle.owner if handle is not None else "the process that called to_object_ref()"
    return CheckpointLostError(
        f"{what} of a transferred checkpoint can no longer be fetched: its owner, "
        f"{owner}, exited or the object was freed ({type(cause).__name__}). A Ray "
        "object lives only as long as the process that created it: keep the process "
        "that called to_object_ref() alive, holding the checkpoint or its ObjectRef, "
        "until every reader has finished, or pack with TransferConfig(owner='node') so "
        "that a long-lived agent on the node owns the chunks."
    )
