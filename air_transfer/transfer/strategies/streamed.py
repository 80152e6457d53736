"""``streamed``: the source node's agent reads the files at transfer time and yields
chunks through a Ray streaming generator with backpressure.

Object-store use stays within ``2 x window x chunk_bytes`` (``window`` produced
ahead, ``window`` being fetched) whatever the checkpoint size, so a checkpoint
several times larger than the object store goes through without spilling. Packing
only reads the files once to take the checksums; the bytes move when a reader asks,
from the directory as it is then, and a directory that changed or vanished since
packing is a SourceChangedError, not a wrong copy: the agent proves every read
against the stamps the scan took at packing (size, times, inode), verified or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
import ray.cloudpickle

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.fetch import fetch_in_order
from air_transfer.cluster.nodes import this_node_id
from air_transfer.cluster.refs import ChecksumRef
from air_transfer.config import TransferConfig
from air_transfer.core.manifest import Manifest
from air_transfer.core.scan import Source, Stamp
from air_transfer.transfer.packing_service import PackingService
from air_transfer.transfer.strategies.base import (
    Chunks,
    Layout,
    Packed,
    PackRequest,
    TransferStrategy,
)


@dataclass(frozen=True)
class StreamSource:
    """The payload: which agent streams which directory."""

    agent: Any
    source: Source
    node_id: str
    #: The files as scanned at packing: the agent proves its reads against them, so a
    #: file changed since packing (or while streamed) is an error even unverified.
    stamps: tuple[Stamp, ...]
    #: Refs of the chunks' checksums while the checksum pass may still be running
    #: (packed by the agent's tasks); the stream waits for each one it checks against.
    checksums: tuple[ChecksumRef, ...] | None = None


class StreamedStrategy(TransferStrategy):
    """Chunks are produced on demand by the source node's agent."""

    name = "streamed"
    layout = Layout.STREAMED
    chunks_kept = True  # object-store chunks, pinned by the views written from them

    def pack(self, request: PackRequest) -> Packed:
        source = request.source
        try:
            ray.cloudpickle.dumps(source)
        except Exception as e:
            raise ValueError(
                f"the 'streamed' strategy has the node agent read {source.root!r} at "
                f"transfer time, but its filesystem ({source.filesystem.type_name}) cannot "
                "be sent to another process; use strategy='chunked'"
            ) from e
        checksums = tuple(c for _, _, c in request.chunks())
        node_id = this_node_id()
        agent = AgentClient(node_id).actor
        return Packed(StreamSource(agent, source, node_id, request.stamps), checksums)

    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Chunks:
        if start >= stop:
            return
        refs = AgentClient(payload.node_id, payload.agent).stream(
            config.window,
            PackingService.stream,
            payload.source,
            list(manifest.files()),
            manifest.chunk_bytes,
            manifest.chunks if manifest.chunks is not None else payload.checksums,
            start,
            stop,
            config.verify,
            payload.stamps,
        )
        # Fetch up to `window` yielded chunks ahead, so cross-node pulls overlap with
        # the reader's writing as they do for `chunked`.
        yield from fetch_in_order(refs, config.window)

    def refs(self, payload: Any) -> list[ray.ObjectRef[Any]]:
        return list(payload.checksums or ())
