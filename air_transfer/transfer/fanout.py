"""Fan-out: a transferred checkpoint read by readers on several nodes at once, its
chunks pushed from the node that packed them about once, not once per reader.

Ray's pull manager fetches an object from a node picked at random among those that
hold a whole copy when the pull starts (docs/scale.md): readers that pull the same
chunks at once all find the packing node alone, and it pushes a copy to each. A
*relay* of a transfer is a copy of its chunks made by the agent of one reader's node
(``FanoutCalls.copy_chunk``: the call's argument is the chunk, pulled to that node
once, the pull its own reader makes anyway, and its return value is the copy, an
object on that node owned by the caller), and a checkpoint whose payload is those
copies, with the same manifest and checksums. Readers given it pull each chunk from
that node or from one another, never from the packing node, and wait for a copy
not made yet as they wait for a chunk not yet packed; each chunk is verified
against its checksum as any chunk is.

A ``Layout.CHUNKS`` transfer (one object per chunk) is relayed from the second
reader's node on. Onto a node whose object store is at least twice the checkpoint
(``RELAY_SHARE``), the relay is of copies: they cost that store one checkpoint for
as long as the relay's checkpoint is referenced, beside its own reader's chunks; the
chunk pulled there is a secondary copy again once copied (Ray may evict it). A
larger checkpoint gets a *windowed* relay (``transfer.relay_window``): its readers
stream the chunks from that node's agent, which keeps at most ``WINDOW_SHARE`` of its
store of them, each stream at most ``STREAM_SHARE`` in flight (its window of chunks
ahead shrunk to fit) and only as many streams at once as fit the rest of
``RELAY_SHARE`` (a reader beyond them reads from the packing node), so the relay
costs that store at most ``RELAY_SHARE`` whatever the checkpoint's size and the
number of readers.

A ``streamed`` transfer (larger than the packing node's store) has no chunk objects:
its relay is one stream of it to the first reader's node, shared by every reader in
lockstep (``transfer.relay_stream``), that node's own reader included, and within
the same shares of its store.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import ray

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import object_store_bytes
from air_transfer.cluster.refs import CheckpointRef
from air_transfer.config import TransferConfig
from air_transfer.core.knobs import KNOBS
from air_transfer.transfer.handle import TransferHandle
from air_transfer.transfer.relay_stream import Bounds, StreamRelay, StreamRelayStrategy
from air_transfer.transfer.relay_window import WindowedRelay, WindowedRelayStrategy
from air_transfer.transfer.start import CHECKPOINT_OF
from air_transfer.transfer.strategies.base import Layout, TransferStrategy

#: The most of a node's object store a relay's copies may take.
RELAY_SHARE = 0.5
#: A windowed relay (``relay_window``) takes at most ``RELAY_SHARE`` of its node's
#: store too: the most it keeps chunks in, the most its readers' streams have in
#: flight there together, and the most one of them has (it then fetches fewer ahead).
WINDOW_SHARE = 0.15
STREAMS_SHARE = RELAY_SHARE - WINDOW_SHARE
STREAM_SHARE = 0.1


class FanoutCalls(Protocol):
    """What a node agent answers for fan-out (callers name these methods)."""

    def copy_chunk(self, chunk: np.ndarray) -> np.ndarray:
        """``chunk`` itself: passed as a ref, Ray pulls it to this node, and the
        return value is a new object here, owned by the caller."""
        ...


class ChunkCopies(FanoutCalls):
    """The agent's side of fan-out: the chunks it copied for relays (counters)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.chunks_copied = 0
        self.bytes_copied = 0

    def copy_chunk(self, chunk: np.ndarray) -> np.ndarray:
        with self._lock:
            self.chunks_copied += 1
            self.bytes_copied += chunk.nbytes
        return chunk


@dataclass(frozen=True)
class Relayed:
    """A relay made: its checkpoint's ref, and whether the readers on its own node
    read it too (a relay of a ``streamed`` transfer: its feed is then the one stream
    of the transfer to that node)."""

    ref: CheckpointRef
    for_its_node: bool


def relay(
    checkpoint: CheckpointRef,
    node: str,
    handle_of: Callable[[object], TransferHandle],
    alone: bool = False,
) -> Relayed | None:
    """A relay of the transferred ``checkpoint`` (owned by this process) on ``node``,
    owned by this process: a checkpoint over copies of its chunks that ``node``'s
    agent makes, or, for a checkpoint larger than ``RELAY_SHARE`` of ``node``'s object
    store, over that agent's window of them, or, for a ``streamed`` transfer, over
    that agent's feed of it (``relay_stream``). None onto a node whose store Ray does
    not list, for a transfer of another layout, and, ``alone`` (for the first reader,
    on ``node``, with no other reader yet), for any but a ``streamed`` transfer: a
    reader on the node of a relay of copies reads the chunks its node pulls anyway."""
    handle = handle_of(ray.get(checkpoint))
    layout = handle.strategy.layout
    if alone and layout is not Layout.STREAMED:
        return None
    store = object_store_bytes(node)
    if store is None:
        return None
    if layout is Layout.STREAMED:
        return Relayed(_put(_fed(handle, AgentClient(node), store)), for_its_node=True)
    if layout is not Layout.CHUNKS or not isinstance(handle.payload, list):
        return None
    agent = AgentClient(node)
    if handle.manifest.total_bytes > store * RELAY_SHARE:
        return Relayed(_put(_windowed(handle, agent, store)), for_its_node=False)
    # Ray resolves a ref passed as an argument: the agent gets the chunk's array.
    copies = [
        agent.call(FanoutCalls.copy_chunk, cast(np.ndarray, chunk)) for chunk in handle.payload
    ]
    return Relayed(_put(dataclasses.replace(handle, payload=copies)), for_its_node=False)


def _fed(handle: TransferHandle, agent: AgentClient, store: int) -> TransferHandle:
    """The ``streamed`` ``handle`` read through a feed on ``agent``'s node, whose
    object store is ``store`` bytes, within ``feed_bounds``. The relay node's own
    reader streams through it too, in place of a stream of its own from the packing
    node."""
    ahead, cap_chunks, streams = feed_bounds(store, handle.manifest.chunk_bytes, handle.config)
    upstream = dataclasses.replace(handle, config=handle.config.replace(window=ahead))
    bounds = Bounds(cap_chunks, streams, KNOBS.relay_stall_s)
    payload = StreamRelay(agent.actor, agent.node_id, handle.transfer_id, upstream, bounds)
    return _streamed_as(handle, StreamRelayStrategy(), payload, ahead)


def feed_bounds(store: int, chunk_bytes: int, config: TransferConfig) -> tuple[int, int, int]:
    """A feed's bounds on a node whose object store is ``store`` bytes: the chunks
    fetched ahead by its stream from the packing node and by each reader's stream
    (``stream_window``), the chunks it keeps (``WINDOW_SHARE`` of the store, one at
    least), and the readers on other nodes that stream at once (each ``2 x ahead``
    chunks in flight, as many as fit the rest of ``RELAY_SHARE``, one at least; the
    relay node's own reader is not one of them: its own stream would cost as much)."""
    ahead = stream_window(store, chunk_bytes, config.window)
    cap_chunks = max(1, int(store * WINDOW_SHARE) // chunk_bytes)
    fed = (cap_chunks + ahead) * chunk_bytes
    streams = max(1, (int(store * RELAY_SHARE) - fed) // (2 * ahead * chunk_bytes))
    return ahead, cap_chunks, streams


def _windowed(handle: TransferHandle, agent: AgentClient, store: int) -> TransferHandle:
    """``handle`` read through a window of ``agent``'s node, whose object store is
    ``store`` bytes: the window keeps ``WINDOW_SHARE`` of it, each reader's stream at
    most ``STREAM_SHARE`` in flight (``2 x window`` chunks; one chunk ahead at least),
    and as many streams at once as fit ``STREAMS_SHARE`` (one at least)."""
    chunk_bytes = handle.manifest.chunk_bytes
    ahead = stream_window(store, chunk_bytes, handle.config.window)
    streams = max(1, int(store * STREAMS_SHARE) // (2 * ahead * chunk_bytes))
    payload = WindowedRelay(
        agent.actor, agent.node_id, handle.transfer_id, tuple(handle.payload),
        int(store * WINDOW_SHARE), streams,
    )  # fmt: skip
    return _streamed_as(handle, WindowedRelayStrategy(), payload, ahead)


def _streamed_as(
    handle: TransferHandle, strategy: TransferStrategy, payload: object, ahead: int
) -> TransferHandle:
    """``handle`` read as ``strategy``'s streams of ``payload``, each reader
    fetching ``ahead`` chunks ahead (the same manifest and checksums)."""
    config = handle.config.replace(window=ahead)
    return dataclasses.replace(handle, strategy=strategy, payload=payload, config=config)


def stream_window(store: int, chunk_bytes: int, window: int) -> int:
    """The chunks a windowed relay's reader fetches ahead (``window`` asked): as many
    as keep its ``2 x window`` chunks in flight within ``STREAM_SHARE`` of ``store``,
    one at least."""
    return max(1, min(window, int(store * STREAM_SHARE) // (2 * chunk_bytes)))


def _put(relayed: TransferHandle) -> CheckpointRef:
    """The ref of a checkpoint over ``relayed``, owned by this process."""
    ref: CheckpointRef = ray.put(CHECKPOINT_OF.get()(relayed))
    return ref
