"""Node storage, the storage-node side: the chunks of an incremental store that this
node does not hold, brought from the sender's directory.

From a sender on another node, its node's agent packs exactly those per-file chunks
(``pack_chunks``: proven reads against the scan's stamps, checksummed) as tasks
this agent submits and owns, a few in flight; each chunk is checked against the
checksum its packing took (ChecksumError: altered on the way). From a sender on
this node, the chunks are read here, proven the same way, and never cross the
object store.
"""

from __future__ import annotations

import errno
from collections import deque
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from ray.exceptions import ObjectLostError, RayActorError

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.fetch import fresh, get
from air_transfer.cluster.nodes import this_node_id
from air_transfer.cluster.refs import ChecksumRef, ChunkRef
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.plan import ChunkPlan
from air_transfer.core.proven_read import FileCursor, fill_chunk
from air_transfer.core.scan import Source
from air_transfer.errors import CheckpointLostError, ChecksumError
from air_transfer.transfer.agent_tasks import task_groups
from air_transfer.transfer.packing_service import PackingService

Sent = Iterator[tuple[ChunkPlan, memoryview]]


def local_chunks(source: Source, plans: Sequence[ChunkPlan]) -> Sent:
    """The chunks of ``plans`` read from ``source`` on this node, one buffer reused."""
    if not plans:
        return
    buffer = memoryview(np.empty(max(p.length for p in plans), dtype=np.uint8))
    with FileCursor(source) as cursor:
        for plan in plans:
            view = buffer[: plan.length]
            fill_chunk(source, plan, view, cursor)
            yield plan, view


def remote_chunks(node_id: str, source: Source, plans: Sequence[ChunkPlan], window: int) -> Sent:
    """The chunks of ``plans`` packed by the agent of ``node_id`` from ``source``
    there, ``window`` packing tasks in flight."""
    agent = AgentClient(node_id)
    groups = iter(task_groups(plans))
    pending: deque[tuple[list[ChunkPlan], list[ChunkRef], list[ChecksumRef]]] = deque()

    def submit() -> None:
        group = next(groups, None)
        if group is not None:
            k = len(group)
            refs = agent.calls(2 * k, PackingService.pack_chunks, source, group)
            pending.append((group, refs[:k], refs[k:]))

    for _ in range(window):
        submit()
    while pending:
        group, chunks, sums = pending.popleft()
        submit()
        for plan, chunk_ref, sum_ref in zip(group, chunks, sums, strict=True):
            try:
                checksum = get(sum_ref)
                if isinstance(checksum, BaseException):  # the packing failed: its error
                    raise fresh(checksum)
                view = memoryview(get(chunk_ref)).cast("B")
            except (RayActorError, ObjectLostError) as e:
                raise lost(node_id, source.root, e) from None
            if chunk_checksum(view) != checksum:
                raise ChecksumError(
                    errno.EBADMSG,
                    f"a chunk of {plan.files[0][0]!r} ({plan.length} bytes at offset "
                    f"{plan.spans[0].file_offset}) from node {node_id} arrived altered; "
                    "nothing was published",
                    source.root,
                )
            yield plan, view


def sender(source: Source, node_id: str, window: int) -> Callable[[Sequence[ChunkPlan]], Sent]:
    """How this node gets chunks of ``source``, a directory on node ``node_id``."""
    if node_id == this_node_id():
        return lambda plans: local_chunks(source, plans)
    return lambda plans: remote_chunks(node_id, source, plans, window)


def lost(node_id: str, directory: str, cause: BaseException) -> CheckpointLostError:
    """The error of a store whose sender's agent died while packing for it."""
    return CheckpointLostError(
        f"the air-transfer agent of node {node_id}, packing {directory!r} for node "
        f"storage, died mid-store ({type(cause).__name__}); nothing was published: "
        "report again"
    )
