"""Windowed relays: fan-out of a checkpoint too large to copy whole on a reader's node.

A relay of a checkpoint larger than ``fanout.RELAY_SHARE`` of the relay node's object
store cannot hold a copy of every chunk there (Ray would spill). Its readers instead
stream the chunks from the relay node's agent (``RelayWindows.relayed_chunks``, a
streaming call at most ``config.window`` objects ahead of its reader, as
``streamed`` does). The agent keeps one *window* per relayed transfer: the chunks it
pulled from the packing node (the same objects its own node's reader pulls, which Ray
pulls to a node once), at most ``cap_bytes`` of them, the lowest dropped first. Each
stream takes a chunk from the window, or pulls it when the window no longer (or not
yet) has it, and yields it: a new object
on the relay node, owned by the reader, freed once it has read it. So the packing
node pushes each chunk about once for all readers in step, and the relay node's
store holds at most ``cap_bytes`` plus each stream's objects in flight
(``2 x window`` chunks), whatever the checkpoint's size, for at most ``max_streams``
streams at once: a reader beyond them is refused (CheckpointLostError, before any
chunk) and reads the transfer itself. The window goes when its last stream ends.

Every chunk is still checked against the manifest's checksum by the reader
(``TransferHandle.verified_chunks``). A relay node or agent lost mid-read fails the
stream (RayActorError, an object lost): the reader sees CheckpointLostError, as for a
relay of copies, and node storage reads the transfer itself again
(``storage.client.directory_reads``).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.fetch import fetch_in_order, get
from air_transfer.cluster.refs import ChunkRef
from air_transfer.cluster.rpc import served
from air_transfer.config import TransferConfig
from air_transfer.core.knobs import KNOBS
from air_transfer.core.manifest import Manifest
from air_transfer.core.threads import pool
from air_transfer.errors import CheckpointLostError
from air_transfer.transfer.strategies.base import Chunks, Packed, PackRequest, TransferStrategy


@dataclass(frozen=True)
class WindowedRelay:
    """The payload of a windowed relay: which agent relays, the transfer's own chunk
    refs (the agent pulls them; a reader holds them, so the transfer stays while it
    reads), and the most bytes the agent's window keeps."""

    agent: Any
    node_id: str
    key: str
    chunks: tuple[ChunkRef, ...]
    cap_bytes: int
    max_streams: int


class WindowedRelayStrategy(TransferStrategy):
    """Chunks streamed from a relay node's window (made by ``fanout.relay``, never
    packed; not registered: readers get the instance in the handle)."""

    name = "relayed"
    chunks_kept = True  # object-store chunks, pinned by the views written from them

    def pack(self, request: PackRequest) -> Packed:
        raise TypeError(
            "the 'relayed' strategy is made of a transfer already packed "
            "(transfer.fanout.relay), never packed itself; use strategy='chunked'"
        )

    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Chunks:
        if start >= stop:
            return
        relay: WindowedRelay = payload
        refs = AgentClient(relay.node_id, relay.agent).stream(
            config.window,
            RelayWindows.relayed_chunks,
            relay.key,
            list(relay.chunks[start:stop]),
            start,
            relay.cap_bytes,
            config.window,
            relay.max_streams,
        )
        yield from fetch_in_order(refs, config.window)

    def refs(self, payload: Any) -> list[ray.ObjectRef[Any]]:
        return list(payload.chunks)


@dataclass
class _Window:
    """The chunks of one relayed transfer kept on this node, by index, and the next
    index each stream in flight takes."""

    cap_bytes: int
    kept: dict[int, np.ndarray] = field(default_factory=dict)
    kept_bytes: int = 0
    next_index: dict[int, int] = field(default_factory=dict)

    def keep(self, index: int, chunk: np.ndarray) -> int:
        """Keep ``chunk`` (unless larger than the cap), then drop the lowest chunks
        while over the cap (every stream has passed those, or the slowest pulls
        again what it still needs). The bytes kept."""
        if index in self.kept or chunk.nbytes > self.cap_bytes:
            return self.kept_bytes
        self.kept[index] = chunk
        self.kept_bytes += chunk.nbytes
        while self.kept_bytes > self.cap_bytes:
            self.kept_bytes -= self.kept.pop(min(self.kept)).nbytes
        return self.kept_bytes


class RelayWindows:
    """What a node agent answers for windowed relays (callers name these methods):
    the windows of the transfers it relays, and counters (tests, the bench)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}
        self._streams = itertools.count()
        self.bytes_pulled = 0  # chunk bytes pulled to this node for windows
        self.bytes_served = 0  # chunk bytes yielded to readers
        self.peak_bytes = 0  # the most bytes one window kept
        self.streams_refused = 0  # streams over a window's max_streams

    @served
    def relayed_chunks(
        self,
        key: str,
        chunks: Sequence[ChunkRef],
        start: int,
        cap_bytes: int,
        window: int,
        max_streams: int,
    ) -> Iterator[np.ndarray]:
        """Chunks ``start``.. of the transfer ``key`` (``chunks``: their refs, in
        order), each from this node's window of ``key`` or pulled into it, pulls
        ``window`` ahead of what is yielded; what a pull raises, raised.
        CheckpointLostError before any chunk while ``max_streams`` streams of ``key``
        run here (the reader then reads the transfer itself)."""
        stream = next(self._streams)
        with self._lock:
            held = self._windows.setdefault(key, _Window(cap_bytes))
            if len(held.next_index) >= max_streams:
                self.streams_refused += 1
                raise CheckpointLostError(
                    f"the relay of transfer {key} on this node already streams to "
                    f"{len(held.next_index)} readers, all that its share of this node's "
                    "object store allows: read the checkpoint from the node that packed it"
                )
            held.next_index[stream] = start
        pulls = pool("air-transfer-relay-window", min(window, KNOBS.max_fetch_threads))
        ahead: deque[Future[np.ndarray]] = deque()
        try:
            upcoming = iter(enumerate(chunks, start))
            for index, ref in itertools.islice(upcoming, window):
                ahead.append(pulls.submit(self._take, held, index, ref))
            index = start
            while ahead:
                chunk = ahead.popleft().result()
                following = next(upcoming, None)
                if following is not None:
                    ahead.append(pulls.submit(self._take, held, *following))
                with self._lock:
                    self.bytes_served += chunk.nbytes
                yield chunk
                del chunk
                index += 1
                with self._lock:
                    held.next_index[stream] = index
        finally:
            for pending in ahead:
                pending.cancel()
            pulls.shutdown(wait=False, cancel_futures=True)
            with self._lock:
                del held.next_index[stream]
                if not held.next_index and self._windows.get(key) is held:
                    del self._windows[key]

    def _take(self, held: _Window, index: int, ref: ChunkRef) -> np.ndarray:
        """Chunk ``index`` from ``held``, else pulled here and kept there."""
        with self._lock:
            chunk = held.kept.get(index)
        if chunk is not None:
            return chunk
        chunk = get(ref)
        with self._lock:
            self.bytes_pulled += chunk.nbytes
            self.peak_bytes = max(self.peak_bytes, held.keep(index, chunk))
        return chunk

    @served
    def relay_windows(self) -> int:
        """How many windows are open (0 once every relayed stream has ended)."""
        with self._lock:
            return len(self._windows)
