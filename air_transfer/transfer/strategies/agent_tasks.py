"""Packing as one task per chunk in the node agent: the refs of every chunk exist
before its bytes do.

Ray creates the ObjectRef of a task's result when the task is submitted, and the
submitter owns it. So the caller (its submitting thread, ``transfer.submit``)
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
from typing import Any

import ray
import ray.cloudpickle

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.core.knobs import KNOBS
from air_transfer.core.plan import ChunkPlan
from air_transfer.core.scan import Source
from air_transfer.transfer.packing_service import PackingService
from air_transfer.transfer.strategies.base import PackRequest


def agent_can_read(source: Source) -> bool:
    """Whether ``source`` can be sent to the agent: a filesystem that lives only in
    this process (a ``PyFileSystem`` over a local object) cannot, and is then packed
    here by the strategy's ``pack``."""
    try:
        ray.cloudpickle.dumps(source)
    except Exception:
        return False
    return True


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


def submit_pack_chunks(
    request: PackRequest,
) -> tuple[list[ray.ObjectRef[Any]], list[ray.ObjectRef[str]]]:
    """Submit ``pack_chunks`` for every chunk to this node's agent; the chunks' refs
    and their checksums' refs, in order, at once."""
    return submit_plans(request.source, request.plans())


def submit_plans(
    source: Source, plans: Iterable[ChunkPlan]
) -> tuple[list[ray.ObjectRef[Any]], list[ray.ObjectRef[str]]]:
    """Submit ``pack_chunks`` for the chunks of ``plans`` (in ``task_groups``) to this
    node's agent; their refs and their checksums' refs, in order."""
    agent = AgentClient()
    data: list[ray.ObjectRef[Any]] = []
    checksums: list[ray.ObjectRef[str]] = []
    for group in task_groups(plans):
        k = len(group)
        refs = agent.calls(2 * k, PackingService.pack_chunks, source, group)
        data += refs[:k]
        checksums += refs[k:]
    return data, checksums


def submit_checksum_chunks(request: PackRequest) -> list[ray.ObjectRef[str]]:
    """Submit ``checksum_chunks`` for every chunk to this node's agent: refs of the
    checksums alone (``streamed`` moves the bytes at transfer time)."""
    agent = AgentClient()
    checksums: list[ray.ObjectRef[str]] = []
    for group in task_groups(request.plans()):
        checksums += agent.calls(len(group), PackingService.checksum_chunks, request.source, group)
    return checksums


def submit_pack_stream(
    request: PackRequest,
) -> tuple[ray.ObjectRef[Any], list[ray.ObjectRef[str]]]:
    """Submit one ``pack_stream`` task for the whole (small) stream: a ref to it as
    one object, and refs of its chunks' checksums."""
    plans = list(request.plans())
    refs = AgentClient().calls(1 + len(plans), PackingService.pack_stream, request.source, plans)
    return refs[0], refs[1:]
