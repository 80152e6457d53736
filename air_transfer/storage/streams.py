"""Node storage, the wire: calls to the storage node's agent, and file bodies moved in
chunks through the object store with a bounded number in flight.

``AgentLink`` is the caller's connection to one storage node's agent: it finds the
agent by name, runs one disk operation per call, and turns Ray's wrappers back into
the OSError the agent raised. A read asks the agent for the refs of the file's
chunks (``disk_chunks``: packed once, confined to the storage root, shared by every
reader) and fetches ``window`` of them ahead, handing pyarrow views of the chunks
themselves; a seek to another chunk starts from there. Writes: ``chunk_writer``.
Memory stays at a few chunks whatever the file size.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Iterator
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from air_transfer import metrics
from air_transfer.config import TransferConfig
from air_transfer.errors import ChecksumError, SourceChangedError
from air_transfer.fetch import fetch_in_order, get, raise_own
from air_transfer.knobs import KNOBS
from air_transfer.manifest import chunk_checksum
from air_transfer.nodes import live_node_ids, node_agent
from air_transfer.reader import ChunkFileReader
from air_transfer.telemetry import NODE_STORAGE, Transfer, describe

logger = logging.getLogger(__name__)


class AgentLink:
    """The connection from this process to the agent of storage node ``node_id``,
    for files under ``root``, moving bodies as ``config`` says."""

    def __init__(self, node_id: str, root: str, config: TransferConfig) -> None:
        self.node_id, self.root, self.config = node_id, root, config
        self._agent: Any = None
        self._lost = False

    def agent(self) -> Any:
        """The storage node's agent (an actor handle), started if needed."""
        if self._agent is None:
            if self.node_id not in live_node_ids():
                raise ConnectionError(
                    f"storage node {self.node_id} is not a live node of this Ray cluster; "
                    "files stored on it are unreachable"
                )
            self._agent = node_agent(self.node_id)
            if self._lost:
                self._lost = False
                logger.warning(
                    "air-transfer: the agent of storage node %s was lost; a new one was started",
                    self.node_id,
                )
        return self._agent

    def call(self, op: str, *args: Any) -> Any:
        """Disk operation ``op`` on the storage node with this storage's root and
        ``args``; its result."""
        with self.errors():
            return get(self.agent().disk.remote(op, self.root, *args))

    def submit(self, op: str, *args: Any) -> ray.ObjectRef[Any]:
        """Start disk operation ``op`` and return its ref (wait with ``wait``)."""
        with self.errors():
            ref: ray.ObjectRef[Any] = self.agent().disk.remote(op, self.root, *args)
            return ref

    def wait(self, ref: ray.ObjectRef[Any]) -> Any:
        with self.errors():
            return get(ref)

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Raise the error of README's table that the agent (or a call it made)
        raised (FileNotFoundError naming the path, CheckpointLostError, ...), not
        Ray's wrapper with the agent's traceback (kept for anything else: a bug); a
        lost agent or node as ConnectionError."""
        try:
            yield
        except RayTaskError as e:
            raise_own(e)  # a copy (see raise_own: a ChunkWriter's frames)
            raise
        except RayActorError as e:
            self._agent, self._lost = None, True
            raise ConnectionError(
                f"the air-transfer agent of storage node {self.node_id} is unreachable "
                f"({type(e).__name__}); its files cannot be reached until it is back"
            ) from e


def open_reader(link: AgentLink, path: str, local: str, size: int) -> ChunkFileReader:
    """A seekable stream over the ``size`` bytes of the file at node path ``local``.

    Unbuffered on purpose: its ``read`` hands out views of the chunks themselves, so
    pyarrow (which accepts any buffer) copies each byte once, into its destination.
    """
    cb = read_chunk_bytes(link.config)
    return ChunkFileReader(path, size, 0, cb, lambda first: _chunks(link, local, size, first))


def read_chunk_bytes(config: TransferConfig) -> int:
    """The chunk size of node-storage reads: ``KNOBS.storage_read_chunk_bytes`` (so
    each of Ray Train's 64 MiB reads is one chunk, served without a copy), but within
    ``config.chunk_bytes`` and twice that, which bounds memory as the config asks."""
    cb = config.chunk_bytes
    return min(max(cb, KNOBS.storage_read_chunk_bytes), 2 * cb)


def _chunks(link: AgentLink, local: str, size: int, first: int) -> Iterator[tuple[int, memoryview]]:
    """Chunks ``first``.. of the file at ``local``, each verified, with
    ``config.window`` fetched ahead: the storage agent packs each chunk once and
    shares it between readers (``disk_chunks``)."""
    cb, window = read_chunk_bytes(link.config), link.config.window
    index = first
    transfer = Transfer(
        "download",
        strategy=NODE_STORAGE,
        total=max(0, size - first * cb),
        desc=describe(local, "read"),
        progress=link.config.progress,
    )
    with transfer, link.errors():
        for chunk, checksum in fetch_in_order(_chunk_refs(link, local, size, first), window):
            if isinstance(checksum, BaseException):  # packing failed: the file changed
                raise SourceChangedError(
                    errno.ESTALE,
                    f"changed while being read (on node {link.node_id}, chunk {index}): "
                    f"{checksum}; read it again",
                    local,
                ) from None
            view = memoryview(chunk).cast("B")
            if link.config.verify and chunk_checksum(view) != checksum:
                raise ChecksumError(
                    errno.EBADMSG,
                    f"chunk {index} of {local!r} from node {link.node_id} does not match "
                    "the checksum it was packed with; read it again",
                    local,
                )
            transfer.advance(len(view))
            if link.config.verify:
                metrics.chunks_verified(1, NODE_STORAGE)
            yield index, view
            index += 1
            if index * cb >= size:
                return


def _chunk_refs(link: AgentLink, local: str, size: int, first: int) -> Iterator[list[Any]]:
    """``[chunk ref, checksum ref]`` of each chunk from ``first``, asked of the agent
    a batch of ``2 x window`` at a time, as the reader gets to them."""
    cb = read_chunk_bytes(link.config)
    batch = 2 * link.config.window
    last = -(-size // cb)
    for index in range(first, last, batch):
        count = min(batch, last - index)
        call = link.agent().file_chunks.remote(
            link.root, local, size, cb, index, count, link.config.cache_bytes
        )
        [pairs] = get(call)
        for chunk, checksum in pairs:
            yield [chunk, checksum]
