"""Lockstep relays of ``streamed`` transfers: fan-out of a checkpoint larger than the
packing node's object store.

A ``streamed`` transfer has no chunk objects to copy or pull: the packing node's
agent reads each chunk from disk when a reader asks, so N readers make that node
read and push the checkpoint N times. Its relay is one *feed*: a stream of the
transfer from the packing node, opened by the relay node's agent and shared by
every reader of the relay, the relay node's own included
(``StreamRelays.relayed_stream``), so each chunk leaves the packing node once.

The readers move in lockstep. The feed keeps at most ``cap_chunks`` chunks ahead of
the slowest reader and waits for it, so the relay node's store holds that window
plus each stream's objects in flight, whatever the checkpoint's size:
- a reader that joins after the feed dropped its first chunks reads those from a
  stream of its own, holding the window at the feed's lowest chunk meanwhile;
- a reader that does not move for ``stall_s`` while the others wait for it is dropped
  (CheckpointLostError: node storage's reader then reads the transfer itself), so
  one stuck reader cannot hold up the rest for longer;
- at most ``max_streams`` readers on other nodes stream at once (their objects in
  flight within the relay's share of the store); one more is refused before its
  first chunk and reads the transfer itself.

The packing node checks every chunk against the packing checksums
(``PackingService.stream``), and each reader against the manifest, as for any read.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.fetch import fetch_in_order, fresh
from air_transfer.cluster.nodes import this_node_id
from air_transfer.cluster.rpc import served
from air_transfer.config import TransferConfig
from air_transfer.core.manifest import Manifest
from air_transfer.errors import CheckpointLostError
from air_transfer.transfer.handle import TransferHandle
from air_transfer.transfer.strategies.base import Chunks, Packed, PackRequest, TransferStrategy

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


@dataclass(frozen=True)
class Bounds:
    """A feed's bounds: chunks kept ahead of its slowest reader, readers on other
    nodes at once, and the seconds a reader may hold the others up."""

    cap_chunks: int
    max_streams: int
    stall_s: float


@dataclass(frozen=True)
class StreamRelay:
    """The payload of a relay of a ``streamed`` transfer: which agent relays, the
    transfer itself (its feed; a reader holds it, so the transfer stays while it
    reads), and the feed's bounds."""

    agent: Any
    node_id: str
    key: str
    upstream: TransferHandle
    bounds: Bounds


class StreamRelayStrategy(TransferStrategy):
    """Chunks of a ``streamed`` transfer streamed from a relay node's feed (made by
    ``fanout.relay``, never packed; not registered: readers get it in the handle)."""

    name = "relayed-stream"
    chunks_kept = True  # object-store chunks, pinned by the views written from them

    def pack(self, request: PackRequest) -> Packed:
        raise TypeError(
            "the 'relayed-stream' strategy is made of a transfer already packed "
            "(transfer.fanout.relay), never packed itself; use strategy='streamed'"
        )

    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Chunks:
        if start >= stop:
            return
        relay: StreamRelay = payload
        refs = AgentClient(relay.node_id, relay.agent).stream(
            config.window,
            StreamRelays.relayed_stream,
            relay.key,
            relay.upstream,
            start,
            stop,
            relay.bounds,
            this_node_id(),
        )
        yield from fetch_in_order(refs, config.window)

    def refs(self, payload: Any) -> list[ray.ObjectRef[Any]]:
        upstream: TransferHandle = payload.upstream
        return upstream.refs()


@dataclass
class _Feed:
    """One relayed transfer's feed on this node: its stream from the packing node,
    the chunks kept (``kept``, by index: the last ``cap_chunks`` fed), the next index
    it feeds (``fed``), and each reader's next index (``next_index``)."""

    upstream: Generator[Buffer, None, None]
    bounds: Bounds
    changed: threading.Condition
    kept: dict[int, Buffer] = field(default_factory=dict)
    fed: int = 0
    feeding: bool = False
    failed: BaseException | None = None
    next_index: dict[int, int] = field(default_factory=dict)
    remote: set[int] = field(default_factory=set)
    dropped: set[int] = field(default_factory=set)
    moved_at: float = field(default_factory=time.monotonic)

    def lowest(self) -> int:
        """The lowest index a reader still needs (``fed`` with none)."""
        return min(self.next_index.values(), default=self.fed)

    def full(self) -> bool:
        return self.fed - self.lowest() >= self.bounds.cap_chunks

    def joinable(self) -> int:
        """The lowest index a reader that joins now may take from the feed: one kept,
        and still kept once the chunk being fed (if any) is added."""
        passing = self.fed + self.feeding - self.bounds.cap_chunks
        return max(min(self.kept, default=self.fed), passing)

    def add(self, chunk: Buffer) -> None:
        """Keep ``chunk``, the next fed, and only the ``cap_chunks`` last fed: every
        reader's next is among them (the feed waits for the slowest), and so is a
        late reader's if it asks within ``cap_chunks`` of the feed."""
        self.kept[self.fed] = chunk
        self.fed += 1
        self.kept.pop(self.fed - 1 - self.bounds.cap_chunks, None)


class StreamRelays:
    """What a node agent answers for relays of ``streamed`` transfers (callers name
    these methods): the feeds of the transfers it relays, and counters (tests, the
    bench)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the feeds; taken before a feed's own lock
        self._counting = threading.Lock()  # the counters; taken after any other
        self._feeds: dict[str, _Feed] = {}
        self._streams = itertools.count()
        self.bytes_fed = 0  # chunk bytes the feeds took from packing nodes
        self.bytes_joined = 0  # chunk bytes late readers read from streams of their own
        self.bytes_served = 0  # chunk bytes yielded to readers
        self.streams_refused = 0  # readers over a feed's max_streams
        self.streams_dropped = 0  # readers dropped for holding the others up

    @served
    def relayed_stream(
        self,
        key: str,
        upstream: TransferHandle,
        start: int,
        stop: int,
        bounds: Bounds,
        reader_node: str,
    ) -> Iterator[Buffer]:
        """Chunks ``start``..``stop - 1`` of the ``streamed`` transfer ``upstream``,
        relayed under ``key``: from this node's feed of it (opened by the first
        reader), in lockstep with its other readers. CheckpointLostError before any
        chunk while ``max_streams`` readers on other nodes than this one read it (the
        reader then reads the transfer itself), and when this reader held the others
        up for ``stall_s``; what the feed's stream raises, raised."""
        stream = next(self._streams)
        here = reader_node == this_node_id()
        feed, joined_at = self._join(key, upstream, start, stop, bounds, stream, here)
        try:
            if start < joined_at:  # the feed has passed them: from a stream of its own
                for chunk in upstream.iter_chunks(start, joined_at):
                    with self._counting:
                        self.bytes_joined += memoryview(chunk).nbytes
                        self.bytes_served += memoryview(chunk).nbytes
                    yield chunk
                    with feed.changed:
                        feed.moved_at = time.monotonic()  # it moves: it holds up none
            for index in range(joined_at, stop):
                chunk = self._take(feed, stream, index)
                with self._counting:
                    self.bytes_served += memoryview(chunk).nbytes
                yield chunk
                del chunk
                with feed.changed:
                    if stream not in feed.dropped:  # its next take raises
                        feed.next_index[stream] = index + 1
                        feed.moved_at = time.monotonic()
                        feed.changed.notify_all()
        finally:
            self._leave(key, feed, stream)

    @served
    def relay_feeds(self) -> int:
        """How many feeds are open (0 once every relayed stream has ended)."""
        with self._lock:
            return len(self._feeds)

    def _join(
        self,
        key: str,
        upstream: TransferHandle,
        start: int,
        stop: int,
        bounds: Bounds,
        stream: int,
        here: bool,
    ) -> tuple[_Feed, int]:
        """The feed of ``key`` (opened at ``start`` if none is) with ``stream``
        (``here``: of a reader on this node) registered, and the index it joins the
        feed at (before it: the chunks the feed dropped already)."""
        with self._lock:
            feed = self._feeds.get(key)
            if feed is None:
                chunks = upstream.iter_chunks(start, upstream.manifest.num_chunks)
                feed = self._feeds[key] = _Feed(chunks, bounds, threading.Condition(), fed=start)
            with feed.changed:
                if not here and len(feed.remote) >= bounds.max_streams:
                    with self._counting:
                        self.streams_refused += 1
                    if not feed.next_index:
                        self._close(key, feed)
                    raise CheckpointLostError(
                        f"the relay of transfer {key} on this node already streams to "
                        f"{len(feed.remote)} readers on other nodes, all that its share of "
                        "this node's object store allows: read the checkpoint from the "
                        "node that packed it"
                    )
                joined_at = min(max(start, feed.joinable()), stop)
                feed.next_index[stream] = joined_at
                if not here:
                    feed.remote.add(stream)
        return feed, joined_at

    def _take(self, feed: _Feed, stream: int, index: int) -> Buffer:
        """Chunk ``index`` of ``feed`` for ``stream``: kept, or fed now by this
        stream (one at a time, while the feed is within its cap of the slowest
        reader), or waited for."""
        with feed.changed:
            while True:
                if stream in feed.dropped:
                    raise CheckpointLostError(
                        f"this reader of a relayed transfer held its other readers up for "
                        f"{feed.bounds.stall_s:g} s: read the checkpoint from the node that "
                        "packed it"
                    )
                if feed.failed is not None:
                    raise fresh(feed.failed)
                if index in feed.kept:
                    return feed.kept[index]
                if index < feed.fed:  # never: the feed waits for its slowest reader
                    raise CheckpointLostError(
                        f"chunk {index} of a relayed transfer left the relay's window "
                        "before this reader took it: read the checkpoint from the node "
                        "that packed it"
                    )
                if not feed.feeding and not feed.full():
                    feed.feeding = True
                    break
                if not feed.changed.wait(feed.bounds.stall_s / 4) and feed.full():
                    self._drop_stalled(feed)
        try:
            chunk = next(feed.upstream)
        except BaseException as e:
            with feed.changed:
                feed.failed = e if isinstance(e, Exception) else CheckpointLostError(str(e))
                feed.feeding = False
                feed.changed.notify_all()
            raise
        with self._counting:
            self.bytes_fed += memoryview(chunk).nbytes
        with feed.changed:
            feed.add(chunk)
            feed.feeding = False
            feed.changed.notify_all()
            return chunk

    def _drop_stalled(self, feed: _Feed) -> None:
        """Drop the slowest readers of a full ``feed`` that has not moved for its
        ``stall_s`` (under its lock)."""
        if time.monotonic() - feed.moved_at < feed.bounds.stall_s:
            return
        lowest = feed.lowest()
        for stalled in [s for s, i in feed.next_index.items() if i == lowest]:
            del feed.next_index[stalled]
            feed.remote.discard(stalled)
            feed.dropped.add(stalled)
            with self._counting:
                self.streams_dropped += 1
        feed.moved_at = time.monotonic()
        feed.changed.notify_all()

    def _leave(self, key: str, feed: _Feed, stream: int) -> None:
        """``stream`` has ended: its place in ``feed`` goes, and the feed with its
        last reader."""
        with self._lock, feed.changed:
            feed.next_index.pop(stream, None)
            feed.remote.discard(stream)
            feed.dropped.discard(stream)
            feed.changed.notify_all()
            if not feed.next_index:
                self._close(key, feed)

    def _close(self, key: str, feed: _Feed) -> None:
        """Forget ``feed`` (under both locks): its stream from the packing node ends."""
        if self._feeds.get(key) is feed:
            del self._feeds[key]
        feed.kept.clear()
        if not feed.feeding:
            feed.upstream.close()
