"""The per-node agent: a long-lived actor that hosts air-transfer's node services.

An object in Ray lives only as long as its owner, and Ray 2.56 removed
``ray.put(_owner=...)``: a worker that packs a checkpoint and exits takes the chunks
with it. ``TransferConfig(owner="node")`` packs inside this agent instead: one actor
per node (0 CPUs, found by name, pinned, detached so it outlives the job).

A composition root: it builds the services of the lower layers (packing and relays,
``transfer``; the transfers it holds for other processes, ``transfer.node_owned``;
node storage, ``storage.server``) and runs each call on the one whose method the
caller names (``call``, typed by ``cluster.agent_client.AgentClient``): no call is
written out here, only what the agent answers of itself (``AgentSelf``). Paths given
to node storage's methods are confined to the root the caller names; the packing
methods read the worker's own directories on this node, by design. It keeps no
chunk alive by itself: chunks stay as long as some ref anywhere refers to them and,
for a transfer packed for another process, as long as that process holds its lease
(``cluster.transfer_leases``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import ray

from air_transfer.cluster.agent_client import AgentSelf
from air_transfer.cluster.identity import Identity, this_process
from air_transfer.cluster.nodes import live_node_ids, object_store_bytes
from air_transfer.cluster.refs import CheckpointRef, DoneRef
from air_transfer.cluster.rpc import R, Services
from air_transfer.config import TransferConfig
from air_transfer.core import process_locks
from air_transfer.core.process_locks import ProcessLock
from air_transfer.core.scan import Source
from air_transfer.storage.server.node_service import NodeStorageService
from air_transfer.transfer import fanout
from air_transfer.transfer.agent_tasks import submit_plans
from air_transfer.transfer.handle import TransferHandle
from air_transfer.transfer.node_owned import NodeOwnedTransfers
from air_transfer.transfer.packing_service import PackingService
from air_transfer.transfer.relay import Relays
from air_transfer.transfer.relay_stream import StreamRelays
from air_transfer.transfer.relay_window import RelayWindows
from air_transfer.transfer.route import start_on_this_thread


def _owned_transfer(source: Source, config: TransferConfig) -> tuple[CheckpointRef, DoneRef | None]:
    """A transfer this agent owns (the chunk cache's whole-directory transfers)."""
    ref, done, _ = start_on_this_thread(source, config.replace(owner="node"))
    return ref, done


def _relay(checkpoint: CheckpointRef, node: str, alone: bool) -> fanout.Relayed | None:
    """A relay, on ``node``, of a whole-directory transfer this agent owns."""
    return fanout.relay(checkpoint, node, _handle_of, alone)


def _handle_of(checkpoint: Any) -> TransferHandle:
    """The handle of a transferred checkpoint (a ``ChunkedCheckpoint``, above this
    layer, or its handle)."""
    if isinstance(checkpoint, TransferHandle):
        return checkpoint
    handle: TransferHandle = checkpoint.handle()
    return handle


class NodeAgent(AgentSelf):
    """Owns the chunks it packs, streams the files of its node, and stores files on
    its disk for the node storage filesystem."""

    def __init__(self) -> None:
        self._packing = PackingService()
        self._owned = NodeOwnedTransfers()
        self._copies = fanout.ChunkCopies()
        self._windows = RelayWindows()
        self._feeds = StreamRelays()
        node = str(ray.get_runtime_context().get_node_id())
        self._storage = NodeStorageService(
            node,
            submit_plans,
            _owned_transfer,
            _handle_of,
            object_store_bytes(node),
            _relay,
            live_node_ids,
        )
        self._services = Services(
            self,
            self._packing,
            Relays(),
            self._copies,
            self._windows,
            self._feeds,
            self._owned,
            *self._storage.services,
            around=self._storage.rules.around,  # every change fenced, then the drain woken
        )

    def call(self, method: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``method(*args, **kwargs)`` on the service that has it (``cluster.rpc``)."""
        result: R = self._services.call(method, *args, **kwargs)
        return result

    def call_streaming(
        self, method: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Iterator[Any]:
        """``call``, for a method that yields (Ray streams what it yields)."""
        yield from self._services.stream(method, *args, **kwargs)

    # -- the agent itself --------------------------------------------------------------
    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def pid(self) -> int:
        return os.getpid()

    def identity(self) -> Identity:
        return this_process()

    def read_counters(self) -> dict[str, int]:
        live = self._owned.live
        return {
            **self._storage.counters(),
            "bytes_packed": self._packing.bytes_packed,
            "bytes_streamed": self._packing.bytes_streamed,
            "chunks_reused": live.chunks_reused,
            "bytes_reused": live.bytes_reused,
            "chunks_relayed": self._copies.chunks_copied,
            "bytes_relayed": self._copies.bytes_copied,
            "window_bytes_pulled": self._windows.bytes_pulled,
            "window_bytes_served": self._windows.bytes_served,
            "window_peak_bytes": self._windows.peak_bytes,
            "window_streams_refused": self._windows.streams_refused,
            "feed_bytes_fed": self._feeds.bytes_fed,
            "feed_bytes_joined": self._feeds.bytes_joined,
            "feed_bytes_served": self._feeds.bytes_served,
            "feed_streams_refused": self._feeds.streams_refused,
            "feed_streams_dropped": self._feeds.streams_dropped,
        }

    def incremental_counters(self) -> dict[str, int]:
        return self._storage.incremental.totals()

    def clear_read_cache(self) -> None:
        self._storage.clear_cache()

    def dead_processes(self, locks: list[ProcessLock]) -> list[ProcessLock]:
        return process_locks.dead(locks)
