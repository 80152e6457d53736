"""Packing shared by the caller and its node's agent, for a caller that blocks until
every chunk is stored (``to_object_ref``): the caller's process is otherwise idle for
that long, and on a node with two cores or more so is a second core.

The agent packs one chunk in three (``agent_tasks``: mapped, hashed, stored; one
copy) and the caller the rest meanwhile: a chunk of one local file goes into the
store straight from its mapping under a read lease (``ChunkPacker.store_each``: the
stamps checked before and after the copy, which is then of the scanned version),
unhashed; its checksum is taken of the stored bytes by a task the agent runs after
its own packing, while the caller has returned and a reader is already writing
(a reader waits for a checksum still to come). So the call waits for one copy per
byte, spread over two processes, and the hash of two thirds of the bytes is off
its path. Two processes, not two threads: the hash holds the GIL. A chunk the
caller cannot map is read and hashed here. Every chunk is owned by the caller, as
before; a change of the source in the caller's part raises SourceChangedError
before the call returns anything, one in the agent's fails the completion.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ray

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.core.knobs import KNOBS
from air_transfer.core.packer import ChunkPacker
from air_transfer.core.plan import ChunkPlan
from air_transfer.observe import metrics
from air_transfer.transfer.strategies.agent_tasks import submit_plans
from air_transfer.transfer.strategies.base import Packed, PackRequest

#: Which chunks the caller stores itself (the agent packs the rest). Two in three:
#: the caller only copies (~0.2 CPU s/GB measured), the agent maps, hashes and
#: copies (~0.45), so both halves take about as long; interleaved, so that both
#: advance through the checkpoint together.
Split = Callable[[ChunkPlan], bool]


def two_in_three(plan: ChunkPlan) -> bool:
    """The caller's part: every chunk but one in three."""
    return plan.index % 3 != 1


def pack_shared(request: PackRequest, here: Split = two_in_three) -> Packed:
    """The chunks of ``request``: the agent's part submitted first, then those
    ``here`` selects stored by this process, their checksums left to the agent where
    they were stored unhashed. Returns once this process's part is stored; the
    ``Packed.stored`` resolves once the agent's is."""
    plans = list(request.plans())
    theirs = [plan for plan in plans if not here(plan)]
    data, sums = submit_plans(request.source, theirs) if theirs else ([], [])
    ours = [plan for plan in plans if here(plan)]
    stored = ChunkPacker().store_each(request.source, ours, ray.put)
    metrics.add_bytes("packed", sum(plan.length for plan in ours), "chunked")
    unhashed = [ref for ref, checksum in stored if checksum is None]
    later = _checksums_of_stored(unhashed, request.chunk_bytes)
    mine = iter(
        (ref, checksum if checksum is not None else next(later)) for ref, checksum in stored
    )
    agent = iter(zip(data, sums, strict=True))
    refs: list[ray.ObjectRef[Any]] = []
    checksums: list[Any] = []
    for plan in plans:
        ref, checksum = next(mine) if here(plan) else next(agent)
        refs.append(ref)
        checksums.append(checksum)
    return Packed(refs, tuple(checksums), stored=tuple(sums))


def _checksums_of_stored(
    refs: list[ray.ObjectRef[Any]], chunk_bytes: int
) -> Iterator[ray.ObjectRef[Any]]:
    """The refs of the checksums of stored chunks ``refs``, in order: hashed by this
    node's agent, as many per task as a packing task takes."""
    agent = AgentClient()
    per_task = max(1, KNOBS.pack_task_bytes // chunk_bytes)
    for start in range(0, len(refs), per_task):
        yield from agent.checksum_stored(refs[start : start + per_task])
