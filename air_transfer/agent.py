"""The per-node agent: a long-lived actor that owns chunks and streams files.

An object in Ray lives only as long as the process that created it (its owner), and
Ray 2.56 removed ``ray.put(_owner=...)``. A training worker that packs a checkpoint
and exits takes the chunks with it. ``TransferConfig(owner="node")`` packs inside
this agent instead: one actor per node (0 CPUs, found by name, started on demand,
pinned to its node), detached so it outlives the job that started it.

Lifetime: an agent lives until ``shutdown_agents()`` is called or its node or the
cluster stops. It keeps no chunk alive by itself: chunks it packed stay in the object
store exactly as long as some checkpoint, handle or ObjectRef anywhere refers to them
(Ray's borrower counting), and are freed when the last one is gone.

The same agent serves the ``streamed`` strategy: it reads a checkpoint's files on its
node lazily, at transfer time, and yields chunks through a Ray streaming generator.
It also serves node storage (``storage_filesystem``): the disk operations of
``LocalStorage`` and ``LocalUploads`` and the streamed reads of one file, for every
node.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from air_transfer.config import TransferConfig
from air_transfer.errors import SourceChangedError
from air_transfer.layout import Source, iter_chunk_spans
from air_transfer.local_storage import LocalStorage
from air_transfer.local_uploads import LocalUploads
from air_transfer.manifest import Entry
from air_transfer.packing import read_chunks_ahead

NAMESPACE = "air_transfer"
_NAME_PREFIX = "air-transfer-agent-"


class NodeAgent(LocalStorage, LocalUploads):
    """Owns the chunks it packs, streams the files of its node, and stores files on
    its disk for the node storage filesystem."""

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def pack(self, source: Source, config: TransferConfig) -> list[ray.ObjectRef]:
        """Pack ``source`` here, so this actor owns the chunks and the handle.

        Returned inside a list: a bare ObjectRef returned by a task would be resolved
        to its value; nested, the caller borrows a ref that this actor owns.
        """
        from air_transfer.handle import pack

        return [ray.put(pack(source, config))]

    def store_checkpoint(self, handle: Any, filesystem: Any, path: str) -> str:
        """Write a transferred checkpoint (a TransferHandle) to ``path`` on
        ``filesystem``, reached from this node; used by ``checkpoint_upload_fn``."""
        from air_transfer.train import store_checkpoint

        return store_checkpoint(handle, filesystem, path)

    def stream(
        self,
        source: Source,
        files: Sequence[Entry],
        chunk_bytes: int,
        checksums: Sequence[str],
        start: int,
        stop: int,
        verify: bool = True,
    ) -> Iterator[np.ndarray]:
        """Read chunks ``start``..``stop - 1`` of ``source`` now and yield them.

        With ``verify``, each chunk is compared with the checksum taken at packing,
        so a directory that changed since then is reported here, naming the files,
        rather than as corrupt bytes on the reader's side.
        """
        for index, view, checksum in read_chunks_ahead(source, files, chunk_bytes, start, stop):
            if verify and checksum != checksums[index]:
                # Which files the chunk carries is only worked out for the message.
                sizes = [f.size for f in files]
                chunk_spans = next(iter_chunk_spans(sizes, chunk_bytes, index))
                names = sorted({files[s.file_index].path for s in chunk_spans})
                raise SourceChangedError(
                    f"checkpoint {source.root!r} changed since it was packed: chunk "
                    f"{index} (files {', '.join(map(repr, names))}) no longer has the "
                    "bytes it had; pack it again"
                )
            # The yielded array is copied into the object store before the generator
            # resumes, so the reader thread may reuse this buffer afterwards.
            yield np.frombuffer(view, dtype=np.uint8)


def agent_name(node_id: str) -> str:
    return f"{_NAME_PREFIX}{node_id}"


_remote_agent: Any = None


def _agent_class() -> Any:
    # ray.remote at first use, not at import (Ray Tune's file_transfer does the
    # latter; it registers a remote class in every process that imports us).
    global _remote_agent
    if _remote_agent is None:
        _remote_agent = ray.remote(NodeAgent)
    return _remote_agent


def node_agent(node_id: str | None = None) -> Any:
    """The agent actor of ``node_id`` (default: this process's node), started if
    needed. Concurrent callers get the same actor (``get_if_exists``)."""
    node_id = node_id or ray.get_runtime_context().get_node_id()
    return (
        _agent_class()
        .options(
            name=agent_name(node_id),
            namespace=NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=32,
            # Never re-run pack or stream work after a failure: a re-run silently
            # re-reads files that may have changed (every chunk is verified anyway).
            max_restarts=0,
            max_task_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        .remote()
    )


def running_in_agent() -> bool:
    ctx = ray.get_runtime_context()
    return bool(ctx.get_actor_id()) and (ctx.get_actor_name() or "").startswith(_NAME_PREFIX)


def shutdown_agents() -> int:
    """Kill every node agent of the cluster; returns how many were running.

    Checkpoints they own become unreadable (CheckpointLostError), so call this once
    no reader needs them, e.g. at the end of a job that used ``owner="node"``.
    """
    killed = 0
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        try:
            actor = ray.get_actor(agent_name(node["NodeID"]), namespace=NAMESPACE)
        except ValueError:
            continue
        ray.kill(actor)
        killed += 1
    return killed


def object_store_free_bytes(node_id: str | None = None) -> int | None:
    """Free object-store bytes on ``node_id`` (default: this node), as the GCS last
    heard from its raylet; None if Ray does not report it.

    Ray decrements the ``object_store_memory`` resource by what the store holds, and
    this per-node view is the only one that needs no grpc/dashboard extras.
    """
    node_id = node_id or ray.get_runtime_context().get_node_id()
    try:
        per_node = ray._private.state.available_resources_per_node()
    except Exception:  # a DeveloperAPI: degrade to "unknown" rather than fail a transfer
        return None
    free = per_node.get(node_id, {}).get("object_store_memory")
    return None if free is None else int(free)
