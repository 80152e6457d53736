"""Packing as tasks in the node agent, for each built-in layout (the ``AGENT``
packer of ``transfer.packers``): the refs of every chunk exist before its bytes do.

Ray creates the ObjectRef of a task's result when the task is submitted, and the
submitter owns it. So the caller (its submitting thread, ``transfer.route``)
submits packing tasks of a few chunks each to its node's agent and holds every
chunk's ref (and its checksum's) within milliseconds; a reader anywhere can start
on chunk 0 while chunk 1 is still being read, and waits for a chunk that is not
packed yet instead of failing. The bytes are read by the agent, outside the caller's
Python (a training loop keeps its GIL), a few chunks at a time (the agent's ``pack``
concurrency group), and checked against the scan's stamps.
Ownership is the caller's, exactly as if it had called ``ray.put``: the chunks die
with the caller, unless the caller is the agent itself (``owner="node"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import this_node_id
from air_transfer.cluster.refs import ChecksumRef, ChunkRef
from air_transfer.core.knobs import KNOBS
from air_transfer.core.plan import ChunkPlan
from air_transfer.core.scan import Source
from air_transfer.transfer.packing_service import PackingService
from air_transfer.transfer.strategies.base import Layout, Packed, PackRequest
from air_transfer.transfer.strategies.streamed import StreamSource


def pack_in_agent(layout: Layout, request: PackRequest) -> Packed:
    """Submit the packing of ``request`` to this node's agent and return at once: a
    payload of ``layout`` whose chunks readers may already ask for (they wait for a
    chunk not yet packed), and checksums that are refs resolving as chunks are
    packed. ``CHUNKS``: one ``pack_chunks`` task per few chunks; ``OBJECT``: one
    ``pack_stream`` task; ``STREAMED``: ``checksum_chunks`` tasks (the bytes move
    at transfer time)."""
    if layout is Layout.CHUNKS:
        data, checksums = submit_plans(request.source, request.plans())
        return Packed(data, tuple(checksums))
    if layout is Layout.OBJECT:
        plans = list(request.plans())
        returns = AgentClient().calls(
            1 + len(plans), PackingService.pack_stream, request.source, plans
        )
        return Packed(returns[0], tuple(returns[1:]))
    if layout is Layout.STREAMED:
        refs = tuple(_checksum_plans(request.source, request.plans()))
        node_id = this_node_id()
        agent = AgentClient(node_id).actor
        return Packed(StreamSource(agent, request.source, node_id, request.stamps, refs), refs)
    raise ValueError(f"the node agent cannot pack a payload of layout {layout.name}")


def task_groups(plans: Iterable[ChunkPlan]) -> Iterator[list[ChunkPlan]]:
    """The chunks each packing task takes: the first ``KNOBS.single_chunk_tasks``
    alone (a reader starts on chunk 0 as soon as it is read), then as many as fit in
    ``KNOBS.pack_task_bytes``. Submitting a task costs ~0.2-0.6 ms, the one cost of
    starting a transfer that grows with the checkpoint (paid by the caller's
    submitting thread); a task holds all its chunk buffers in the agent until it
    returns."""
    group: list[ChunkPlan] = []
    size = 0
    for plan in plans:
        if group and size + plan.length > KNOBS.pack_task_bytes:
            yield group
            group, size = [], 0
        group.append(plan)
        size += plan.length
        if plan.index < KNOBS.single_chunk_tasks:
            yield group
            group, size = [], 0
    if group:
        yield group


def submit_plans(
    source: Source, plans: Iterable[ChunkPlan]
) -> tuple[list[ChunkRef], list[ChecksumRef]]:
    """Submit ``pack_chunks`` for the chunks of ``plans`` (in ``task_groups``) to this
    node's agent; their refs and their checksums' refs, in order."""
    agent = AgentClient()
    data: list[ChunkRef] = []
    checksums: list[ChecksumRef] = []
    for group in task_groups(plans):
        k = len(group)
        refs = agent.calls(2 * k, PackingService.pack_chunks, source, group)
        data += refs[:k]
        checksums += refs[k:]
    return data, checksums


def _checksum_plans(source: Source, plans: Iterable[ChunkPlan]) -> list[ChecksumRef]:
    """Submit ``checksum_chunks`` for the chunks of ``plans`` to this node's agent:
    refs of the checksums alone (``streamed`` moves the bytes at transfer time)."""
    agent = AgentClient()
    checksums: list[ChecksumRef] = []
    for group in task_groups(plans):
        checksums += agent.calls(len(group), PackingService.checksum_chunks, source, group)
    return checksums
