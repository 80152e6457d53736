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

Only ``Layout.CHUNKS`` transfers are relayed (one object per chunk). Onto a node
whose object store is at least twice the checkpoint (``RELAY_SHARE``), the relay is
of copies: they cost that store one checkpoint for as long as the relay's checkpoint
is referenced, beside its own reader's chunks; the chunk pulled there is a secondary
copy again once copied (Ray may evict it). A larger checkpoint gets a *windowed*
relay (``transfer.relay_window``): its readers stream the chunks from that node's
agent, which keeps at most ``WINDOW_SHARE`` of its store of them, each stream at most
``STREAM_SHARE`` in flight (its window of chunks ahead shrunk to fit) and only as many
streams at once as fit the rest of ``RELAY_SHARE`` (a reader beyond them reads from
the packing node), so the relay costs that store at most ``RELAY_SHARE`` whatever the
checkpoint's size and the number of readers.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Protocol, cast

import numpy as np
import ray

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import object_store_bytes
from air_transfer.cluster.refs import CheckpointRef
from air_transfer.transfer.handle import TransferHandle
from air_transfer.transfer.relay_window import WindowedRelay, WindowedRelayStrategy
from air_transfer.transfer.start import CHECKPOINT_OF
from air_transfer.transfer.strategies.base import Layout

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


def relay(
    checkpoint: CheckpointRef, node: str, handle_of: Callable[[object], TransferHandle]
) -> CheckpointRef | None:
    """A relay of the transferred ``checkpoint`` (owned by this process) on ``node``,
    owned by this process: the ref of a checkpoint over copies of its chunks that
    ``node``'s agent makes, or, for a checkpoint larger than ``RELAY_SHARE`` of
    ``node``'s object store, over that agent's window of them; None for a transfer
    that is not one object per chunk, or onto a node whose store Ray does not list."""
    handle = handle_of(ray.get(checkpoint))
    if handle.strategy.layout is not Layout.CHUNKS or not isinstance(handle.payload, list):
        return None
    store = object_store_bytes(node)
    if store is None:
        return None
    agent = AgentClient(node)
    if handle.manifest.total_bytes > store * RELAY_SHARE:
        return _put(_windowed(handle, agent, store))
    # Ray resolves a ref passed as an argument: the agent gets the chunk's array.
    copies = [
        agent.call(FanoutCalls.copy_chunk, cast(np.ndarray, chunk)) for chunk in handle.payload
    ]
    return _put(dataclasses.replace(handle, payload=copies))


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
    return dataclasses.replace(
        handle,
        strategy=WindowedRelayStrategy(),
        payload=payload,
        config=handle.config.replace(window=ahead),
    )


def stream_window(store: int, chunk_bytes: int, window: int) -> int:
    """The chunks a windowed relay's reader fetches ahead (``window`` asked): as many
    as keep its ``2 x window`` chunks in flight within ``STREAM_SHARE`` of ``store``,
    one at least."""
    return max(1, min(window, int(store * STREAM_SHARE) // (2 * chunk_bytes)))


def _put(relayed: TransferHandle) -> CheckpointRef:
    """The ref of a checkpoint over ``relayed``, owned by this process."""
    ref: CheckpointRef = ray.put(CHECKPOINT_OF.get()(relayed))
    return ref
