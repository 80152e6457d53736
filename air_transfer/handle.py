"""A packed checkpoint in transit: manifest + strategy + payload, and the packing step
that makes one.

This is what a transferred checkpoint pickles as: a few KB of manifest plus the
payload's ObjectRefs, never the bytes themselves (Ray keeps refs nested in a put
object alive for as long as that object is referenced). A handle may describe a
transfer whose packing is still running (``submit``): its chunks' checksums are then
refs too, each resolving when its chunk is packed, and a reader simply waits for a
chunk that is not there yet.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import os
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import ray
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError

from air_transfer import _ray, metrics
from air_transfer.config import TransferConfig
from air_transfer.errors import CheckpointLostError, ChecksumError
from air_transfer.fetch import fetch_in_order
from air_transfer.layout import Source, scan
from air_transfer.manifest import Manifest
from air_transfer.nodes import node_agent, this_node_id
from air_transfer.reader import ChunkFileReader, buffered
from air_transfer.strategies import TransferStrategy, get_strategy, select_strategy
from air_transfer.telemetry import Transfer, describe
from air_transfer.writer import check_chunk, checked_chunks, write_tree


@dataclass(frozen=True, eq=False)
class TransferHandle:
    """Everything a reader anywhere in the cluster needs to rebuild the checkpoint.

    ``pending`` holds the refs of the chunks' checksums while packing may still be
    running (``manifest.chunks`` is then None); ``complete()`` waits for them.
    """

    manifest: Manifest
    strategy: TransferStrategy
    payload: Any
    config: TransferConfig
    owner: str
    transfer_id: str
    pending: tuple[Any, ...] | None = None

    def checksums(self, start: int = 0, stop: int | None = None) -> Generator[str, None, None]:
        """The checksums of chunks ``start``..``stop - 1``, in order, each as soon as
        its chunk is packed; raises what packing raised."""
        stop = self.manifest.num_chunks if stop is None else stop
        if self.manifest.chunks is not None:
            yield from self.manifest.chunks[start:stop]
            return
        assert self.pending is not None
        index = start
        try:
            for checksum in fetch_in_order(self.pending[start:stop], self.config.window):
                if isinstance(checksum, BaseException):  # packing failed: see NodeAgent
                    raise fresh(checksum)
                yield checksum
                index += 1
        except (RayTaskError, ObjectLostError, RayActorError) as e:
            raise_transfer_error(self, f"the checksum of chunk {index}", e)

    def complete(self) -> TransferHandle:
        """This handle with every checksum in its manifest: waits for packing to
        finish, and raises what it raised."""
        if self.pending is None:
            return self
        manifest = self.manifest.with_checksums(list(self.checksums()))
        return dataclasses.replace(self, manifest=manifest, pending=None)

    def iter_chunks(self, start: int = 0, stop: int | None = None) -> Generator[Any, None, None]:
        """Chunks ``start``..``stop - 1`` in order as the strategy delivers them
        (unverified); a lost chunk raises CheckpointLostError, a failed packing what
        packing raised."""
        stop = self.manifest.num_chunks if stop is None else stop
        index = start
        name = self.strategy.name
        try:
            for chunk in self.strategy.iter_chunks(
                self.payload, self.manifest, start, stop, self.config
            ):
                metrics.add_bytes("fetched", _nbytes(chunk), name)
                yield chunk
                index += 1
        except (RayTaskError, ObjectLostError, RayActorError) as e:
            raise_transfer_error(self, f"chunk {index} of {self.manifest.num_chunks}", e)

    def verified_chunks(self, start: int, stop: int) -> Iterator[tuple[int, memoryview]]:
        """``(index, view)`` for chunks ``start``..``stop - 1``, each checked."""
        pairs = zip(self.iter_chunks(start, stop), self.checksums(start, stop), strict=True)
        for index, (chunk, expected) in enumerate(pairs, start):
            view = memoryview(chunk).cast("B")
            try:
                check_chunk(self.manifest, index, view, self.config.verify, expected=expected)
            except ChecksumError:
                metrics.checksum_failure(self.strategy.name)
                raise
            if self.config.verify:
                metrics.chunks_verified(1, self.strategy.name)
            yield index, view

    def write_to(
        self, target: str | os.PathLike[str], check: Callable[[], None] | None = None
    ) -> str:
        """Rebuild the checkpoint at ``target``, writing each chunk as it arrives
        (while later ones are still being packed or fetched); the target shows the
        result only once complete and verified, and an existing directory is merged
        into (the merged tree replaces it in one step). Shows progress and records
        metrics as a transfer of phase ``read`` (``air_transfer.telemetry``).
        ``check`` is called before each chunk; what it raises ends the write."""
        transfer = Transfer(
            "read",
            strategy=self.strategy.name,
            total=self.manifest.total_bytes,
            desc=describe(target, "to_directory"),
            progress=self.config.progress,
        )
        with transfer:
            chunks = self.iter_chunks()
            written = transfer.chunks(chunks, self.manifest.chunk_length, self.config.verify)
            expected = None if self.manifest.chunks is not None else self.checksums()
            try:
                return write_tree(
                    self.manifest,
                    checked_chunks(written, check),
                    target,
                    self.config.verify,
                    self.config.direct_io,
                    expected=expected,
                )
            finally:
                # At once, not when garbage collected: fetches in flight hold chunks.
                written.close()
                chunks.close()
                if expected is not None:
                    expected.close()

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
        state = "" if self.pending is None else ", packing may be running"
        return (
            f"strategy={self.strategy.name!r}, files={n_files}, bytes={m.total_bytes}, "
            f"chunks={m.num_chunks}{state}"
        )


def submit(
    source: Source, config: TransferConfig | None = None
) -> tuple[TransferHandle, ray.ObjectRef[Any] | None]:
    """Scan ``source``, pick a strategy (``config.strategy``, else by size against
    the free object store) and start packing it in this node's agent, owned by this
    process. Returns the handle, usable at once, and a ref that resolves when every
    chunk is packed (raising what packing raised), or None if packing is done."""
    config = config or TransferConfig()
    scanned = scan(source, follow_symlinks=config.follow_symlinks)
    total = sum(f.size for f in scanned.files)
    here = this_node_id()
    strategy = get_strategy(select_strategy(total, config, _ray.object_store_free_bytes(here)))()
    # The strategy proves every byte it reads against the scan's stamps, so the
    # manifest's sizes and mtimes are those of the bytes packed.
    packed = strategy.submit(source, scanned.files, scanned.stamps, config)
    pending = packed.pending
    if not pending:  # packed here (else the agent's packing tasks count the bytes)
        metrics.add_bytes("packed", total, strategy.name)
    manifest = Manifest(
        entries=scanned.entries,
        chunk_bytes=config.chunk_bytes,
        chunks=None if pending else packed.checksums,
    )
    handle = TransferHandle(
        manifest=manifest,
        strategy=strategy,
        payload=packed.payload,
        config=config,
        owner=describe_current_process(),
        transfer_id=uuid.uuid4().hex,
        pending=packed.checksums if pending else None,
    )
    done = node_agent(here).packed.remote(*packed.checksums) if pending else None
    return handle, done


def pack(source: Source, config: TransferConfig | None = None) -> TransferHandle:
    """``submit``, then wait until every chunk is packed: a complete handle."""
    return submit(source, config)[0].complete()


def _nbytes(chunk: Any) -> int:
    """The size of a chunk as delivered (any buffer)."""
    try:
        return memoryview(chunk).nbytes
    except TypeError:
        return 0


def describe_current_process() -> str:
    """Who owns what this process puts: named in CheckpointLostError messages."""
    ctx = ray.get_runtime_context()
    actor_id = ctx.get_actor_id()
    if actor_id:
        role = f"actor {ctx.get_actor_name() or actor_id[:12]}"
    elif ctx.worker.mode == ray.SCRIPT_MODE:
        role = "the driver"
    else:
        role = f"task {ctx.get_task_function_name() or '?'}"
    worker, node = ctx.get_worker_id()[:12], ctx.get_node_id()[:12]
    return f"{role} (worker {worker}, pid {os.getpid()}, node {node})"


def raise_transfer_error(
    handle: TransferHandle | None, what: str, error: BaseException
) -> NoReturn:
    """Raise what a failed fetch of ``what`` means for the reader: the error packing
    raised (SourceChangedError, PermissionError, ... as packing raised it, not Ray's
    wrapper), or CheckpointLostError when the owner or the object is gone."""
    if isinstance(error, RayTaskError):
        cause = error.cause
        if isinstance(cause, (ObjectLostError, RayActorError)):
            raise lost_error(handle, what, cause) from error
        if isinstance(cause, Exception):
            raise fresh(cause) from None
        raise error
    raise lost_error(handle, what, error) from error


def fresh(error: BaseException) -> BaseException:
    """A copy of ``error`` to raise in its place. Raising an exception that a frame of
    its own traceback still references (a loop variable, Ray's wrapper whose
    ``cause`` it is) makes a reference cycle: the frames, and the handle with every
    chunk ref they hold, would then stay alive until the garbage collector runs,
    keeping the chunks pinned in the object store."""
    return copy.copy(error)


def lost_error(
    handle: TransferHandle | None, what: str, cause: BaseException
) -> CheckpointLostError:
    """The CheckpointLostError for ``what`` (a chunk, the handle) being unfetchable."""
    owner = handle.owner if handle is not None else "the process that called to_object_ref()"
    metrics.lost(handle.strategy.name if handle is not None else "unknown")
    return CheckpointLostError(
        f"{what} of a transferred checkpoint can no longer be fetched: its owner, "
        f"{owner}, exited or the object was freed ({type(cause).__name__}). A Ray "
        "object lives only as long as the process that created it: keep the process "
        "that called to_object_ref() alive, holding the checkpoint or its ObjectRef, "
        "until every reader has finished, or pack with TransferConfig(owner='node') so "
        "that a long-lived agent on the node owns the chunks."
    )
