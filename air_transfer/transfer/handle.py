"""A packed checkpoint in transit: manifest + strategy + payload (made by
``transfer.start``).

This is what a transferred checkpoint pickles as: a few KB of manifest plus the
payload's ObjectRefs, never the bytes themselves (Ray keeps refs nested in a put
object alive for as long as that object is referenced). A handle may describe a
transfer whose packing is still running (``start``): its chunks' checksums are then
refs too, each resolving when its chunk is packed, and a reader simply waits for a
chunk that is not there yet.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import ray
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError

from air_transfer.cluster.fetch import fetch_in_order, fresh, innermost, raise_own
from air_transfer.cluster.refs import PendingChecksum
from air_transfer.config import TransferConfig
from air_transfer.core.manifest import Manifest
from air_transfer.core.reader import ChunkFileReader, buffered
from air_transfer.core.writer import check_chunk, checked_chunks, write_tree
from air_transfer.errors import CheckpointLostError, ChecksumError
from air_transfer.observe import metrics
from air_transfer.observe.telemetry import Transfer, describe
from air_transfer.transfer.strategies import TransferStrategy

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

#: What a ``ray.get`` raises for a failed task or a lost object or actor: what
#: ``raise_transfer_error`` turns into the error the caller should see.
RAY_ERRORS = (RayTaskError, ObjectLostError, RayActorError)


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
    pending: tuple[PendingChecksum, ...] | None = None

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
        except RAY_ERRORS as e:
            raise_transfer_error(self, f"the checksum of chunk {index}", e)

    def complete(self) -> TransferHandle:
        """This handle with every checksum in its manifest: waits for packing to
        finish, and raises what it raised."""
        if self.pending is None:
            return self
        manifest = self.manifest.with_checksums(list(self.checksums()))
        return dataclasses.replace(self, manifest=manifest, pending=None)

    def iter_chunks(self, start: int = 0, stop: int | None = None) -> Generator[Buffer, None, None]:
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
        except RAY_ERRORS as e:
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
        self,
        target: str | os.PathLike[str],
        check: Callable[[], None] | None = None,
        *,
        follow_target: bool = True,
    ) -> str:
        """Rebuild the checkpoint at ``target``, writing each chunk as it arrives
        (while later ones are still being packed or fetched); the target shows the
        result only once complete and verified, and an existing directory is merged
        into (the merged tree replaces it in one step). Shows progress and records
        metrics as a transfer of phase ``read`` (``air_transfer.observe.telemetry``).
        ``check`` is called before each chunk; what it raises ends the write.
        ``follow_target``: as for ``writer.write_tree``."""
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
                    follow_target=follow_target,
                    chunks_kept=self.strategy.chunks_kept,
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

        def open_chunks(first: int, _last: int) -> Iterator[tuple[int, memoryview]]:
            return self.verified_chunks(first, max(last, first))

        raw = ChunkFileReader(entry.path, entry.size, offset, cb, open_chunks)
        return buffered(raw, cb)

    def refs(self) -> list[ray.ObjectRef[Any]]:
        """The ObjectRefs a reader of this transfer needs: those of the payload (as
        its strategy reads them: ``TransferStrategy.refs``) and the checksums' while
        packing may run."""
        pending = [c for c in self.pending or () if isinstance(c, ray.ObjectRef)]
        return [*self.strategy.refs(self.payload), *pending]

    def describe(self) -> str:
        """One line for people: strategy, files, bytes, chunks, whether packing may
        still be running."""
        m = self.manifest
        n_files = sum(1 for _ in m.files())
        state = "" if self.pending is None else ", packing may be running"
        return (
            f"strategy={self.strategy.name!r}, files={n_files}, bytes={m.total_bytes}, "
            f"chunks={m.num_chunks}{state}"
        )


def _nbytes(chunk: Buffer) -> int:
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
    """Raise what a failed fetch or call for ``what`` means for the reader: the error
    of README's table that packing raised (SourceChangedError, PermissionError, ...
    as packing raised it, not Ray's wrapper of each hop), CheckpointLostError when
    the owner or the object is gone, else Ray's error (a bug, its traceback kept)."""
    cause = innermost(error)
    if isinstance(cause, (ObjectLostError, RayActorError)):
        raise lost_error(handle, what, cause) from error
    raise_own(error)
    raise error


def lost_error(
    handle: TransferHandle | None, what: str, cause: BaseException
) -> CheckpointLostError:
    """The CheckpointLostError for ``what`` (a chunk, the handle) being unfetchable."""
    owner = handle.owner if handle is not None else "the process that called to_object_ref()"
    metrics.lost(handle.strategy.name if handle is not None else "unknown")
    if isinstance(cause, RayActorError):  # the actor computing it died, not its owner
        return CheckpointLostError(
            f"{what} of a transferred checkpoint can no longer be fetched: the "
            f"air-transfer agent that was packing it died before it was stored "
            f"({type(cause).__name__}); its owner, {owner}, is not the one that exited. "
            "The checkpoint is incomplete: transfer it again (a new agent starts on "
            "that node at the next transfer)."
        )
    return CheckpointLostError(
        f"{what} of a transferred checkpoint can no longer be fetched: its owner, "
        f"{owner}, exited or the object was freed ({type(cause).__name__}). A Ray "
        "object lives only as long as the process that created it: keep the process "
        "that called to_object_ref() alive, holding the checkpoint or its ObjectRef, "
        "until every reader has finished, or pack with TransferConfig(owner='node') so "
        "that a long-lived agent on the node owns the chunks."
    )
