"""Node storage, the wire: calls to the storage node's agent, and file bodies moved in
chunks through the object store with a bounded number in flight.

``AgentLink`` is the caller's connection to one storage node's agent: it finds the
agent by name, runs one disk operation per call, and turns Ray's wrappers back into
the OSError the agent raised. A read asks the agent for the refs of the file's
chunks (``storage.server.chunk_cache``: packed once, confined to the storage root,
shared by every reader) and fetches ``window`` of them ahead, handing pyarrow views
of the chunks themselves; a seek to another chunk starts from there, fetching only
the chunks of the read that sought until the reader goes on past them (a byte-range
read costs its own chunks, not a window of them). Writes: ``chunk_writer``.
Memory stays at a few chunks whatever the file size.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, TypeVar

import ray
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.fetch import fetch_in_order, get, innermost, raise_own
from air_transfer.cluster.nodes import agents_generation, live_node_ids
from air_transfer.cluster.rpc import P, R, S
from air_transfer.config import TransferConfig
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.knobs import KNOBS
from air_transfer.core.reader import ChunkFileReader
from air_transfer.errors import CheckpointLostError, ChecksumError, SourceChangedError
from air_transfer.observe import metrics
from air_transfer.observe.telemetry import NODE_STORAGE, Transfer, describe
from air_transfer.storage.node_api import NodeReads

logger = logging.getLogger(__name__)
T = TypeVar("T")


class AgentLink:
    """The connection from this process to the agent of storage node ``node_id``,
    for files under ``root``, moving bodies as ``config`` says. A call names the
    method of node storage that answers it (``link.call(NodeMetadata.fs_info, root,
    paths)``, ``storage.node_api``), and the agent's errors come back as the built-in
    errors it raised."""

    def __init__(self, node_id: str, root: str, config: TransferConfig) -> None:
        self.node_id, self.root, self.config = node_id, root, config
        self._agent: AgentClient | None = None
        self._generation = agents_generation()
        self._lost = False
        #: Counts the agents this link has reached: a new one (the agent restarted)
        #: knows nothing a caller told the one before (its durable tier's credentials).
        self.agents_made = 0

    def agent(self) -> AgentClient:
        """The storage node's agent, started if needed (again, after this process
        ended the agents with ``shutdown_agents()``)."""
        if self._generation != agents_generation():
            self._agent, self._generation = None, agents_generation()
        if self._agent is None:
            if self.node_id not in live_node_ids():
                raise ConnectionError(
                    f"storage node {self.node_id} is not a live node of this Ray cluster; "
                    "files stored on it are unreachable"
                )
            self._agent = AgentClient(self.node_id)
            self.agents_made += 1
            if self._lost:
                self._lost = False
                logger.warning(
                    "air-transfer: the agent of storage node %s was lost; a new one was started",
                    self.node_id,
                )
        return self._agent

    def call(
        self, method: Callable[Concatenate[S, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """``method(*args, **kwargs)`` on the storage node's agent: its result."""
        with self.errors():
            result: R = get(self.agent().call(method, *args, **kwargs))
            return result

    def submit(
        self, method: Callable[Concatenate[S, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> ray.ObjectRef[R]:
        """Start ``method(*args, **kwargs)`` on the agent: its ref (wait with ``wait``)."""
        with self.errors():
            return self.agent().call(method, *args, **kwargs)

    def wait(self, ref: ray.ObjectRef[T]) -> T:
        with self.errors():
            result: T = get(ref)
            return result

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Raise the error of README's table that the agent (or a call it made)
        raised (FileNotFoundError naming the path, CheckpointLostError, ...), not
        Ray's wrapper with the agent's traceback (kept for anything else: a bug); a
        lost agent or node as ConnectionError; an argument of the call that Ray could
        not resolve (a checkpoint whose packing agent or owner died before handing
        it over) as CheckpointLostError; a chunk of a read lost with the agent that
        owned it (Ray's OwnerDiedError) as ConnectionError too."""
        try:
            yield
        except RayTaskError as e:
            raise_own(e)  # a copy (see raise_own: a NodeUpload's frames)
            cause = innermost(e)
            if isinstance(cause, (RayActorError, ObjectLostError)):
                raise CheckpointLostError(
                    f"what was sent to the agent of storage node {self.node_id} was lost "
                    f"before it could read it ({type(cause).__name__}: the process or node "
                    "agent that held it died)"
                ) from None
            raise
        except RayActorError as e:
            self._agent, self._lost = None, True
            raise ConnectionError(
                f"the air-transfer agent of storage node {self.node_id} is unreachable "
                f"({type(e).__name__}); its files cannot be reached until it is back"
            ) from e
        except ObjectLostError as e:  # a chunk the agent packed and owned: it died
            self._agent, self._lost = None, True
            raise ConnectionError(
                f"a chunk read from storage node {self.node_id} was lost "
                f"({type(e).__name__}): the air-transfer agent that owned it, or its "
                "node, died mid-read; read it again once the agent is back (a new one "
                "starts at the next call)"
            ) from None  # not chained: Ray's error holds the reader's frames and refs


def open_reader(link: AgentLink, path: str, local: str, size: int) -> ChunkFileReader:
    """A seekable stream over the ``size`` bytes of the file at node path ``local``.

    Unbuffered on purpose: its ``read`` hands out views of the chunks themselves, so
    pyarrow (which accepts any buffer) copies each byte once, into its destination.
    """
    cb = read_chunk_bytes(link.config)
    return ChunkFileReader(
        path, size, 0, cb, lambda first, last: _chunks(link, local, size, first, last)
    )


def read_chunk_bytes(config: TransferConfig) -> int:
    """The chunk size of node-storage reads: ``KNOBS.storage_read_chunk_bytes`` (so
    each of Ray Train's 64 MiB reads is one chunk, served without a copy), but within
    ``config.chunk_bytes`` and twice that, which bounds memory as the config asks."""
    cb = config.chunk_bytes
    return min(max(cb, KNOBS.storage_read_chunk_bytes), 2 * cb)


def _chunks(
    link: AgentLink, local: str, size: int, first: int, last: int, chunk_bytes: int = 0
) -> Iterator[tuple[int, memoryview]]:
    """Chunks ``first``.. of the file at ``local``, each verified: first those up to
    ``last`` (what the read that opened the stream needs: a byte range, as torch DCP
    reads, costs only its chunks), then, once the reader asks for more, the rest
    with ``config.window`` fetched ahead. The storage agent packs each chunk once and
    shares it between readers (``storage.server.chunk_cache``). Chunks of
    ``chunk_bytes`` (0: ``read_chunk_bytes``)."""
    cb = chunk_bytes or read_chunk_bytes(link.config)
    end = -(-size // cb)
    mid = max(first, min(last + 1, end))
    transfer = Transfer(
        "download",
        strategy=NODE_STORAGE,
        total=max(0, size - first * cb),
        desc=describe(local, "read"),
        progress=link.config.progress,
    )
    with transfer, link.errors():
        for start, stop in ((first, mid), (mid, end)):
            if start >= stop:
                continue
            refs = _chunk_refs(link, local, size, start, stop, cb)
            pairs = fetch_in_order(refs, link.config.window)
            for index, (chunk, checksum) in enumerate(pairs, start):
                view = _verified(link, local, index, chunk, checksum)
                transfer.advance(len(view))
                yield index, view


def _verified(link: AgentLink, local: str, index: int, chunk: Any, checksum: Any) -> memoryview:
    """Chunk ``index`` of ``local`` as bytes, checked against its checksum."""
    if isinstance(checksum, FileNotFoundError):  # deleted: a stored file changes no other way
        raise FileNotFoundError(
            errno.ENOENT,
            f"deleted while being read (on node {link.node_id}, chunk {index}): {checksum}",
            local,
        ) from None
    if isinstance(checksum, BaseException):  # packing failed: the file changed
        raise SourceChangedError(
            errno.ESTALE,
            f"changed while being read (on node {link.node_id}, chunk {index}): "
            f"{checksum}; read it again",
            local,
        ) from None
    view = memoryview(chunk).cast("B")
    if link.config.verify:
        if chunk_checksum(view) != checksum:
            raise ChecksumError(
                errno.EBADMSG,
                f"chunk {index} of {local!r} from node {link.node_id} does not match "
                "the checksum it was packed with; read it again",
                local,
            )
        metrics.chunks_verified(1, NODE_STORAGE)
    return view


def _chunk_refs(
    link: AgentLink, local: str, size: int, first: int, stop: int, cb: int
) -> Iterator[list[Any]]:
    """``[chunk ref, checksum ref]`` of chunks of ``cb`` bytes ``first``..``stop - 1``,
    asked of the agent a batch of ``2 x window`` at a time, as the reader gets to them."""
    batch = 2 * link.config.window
    for index in range(first, stop, batch):
        count = min(batch, stop - index)
        call = link.agent().call(
            NodeReads.file_chunks, link.root, local, size, cb, index, count, link.config.cache_bytes
        )
        [pairs] = get(call)
        for chunk, checksum in pairs:
            yield [chunk, checksum]
