"""Packing shared by the caller and its node's agent, for a caller that blocks until
every chunk is stored (``to_object_ref``): the caller's process is otherwise idle for
that long, and on a node with two cores or more so is a second core.

The agent stores every other chunk (``store_chunks``) and the caller the rest
meanwhile (``ChunkPacker.store_each``): a chunk of one local file goes into the store
straight from its mapping under a read lease, unhashed (the lease keeps the file as
checked before the mapping until the copy is made; the caller checks it again
after). Each process then hashes the stored bytes of its part (the agent:
``checksum_stored``), and the call returns once every checksum is taken, so that
nothing of the checkpoint depends on the agent afterwards: the call waits for one
copy and one hash per byte, spread over two processes, and a checksum proves what
was stored. Two processes, not two threads: the hash holds the GIL. A chunk that
cannot be mapped is read and hashed as before. Every chunk is owned by the caller,
as before; a change of the source in the caller's part raises SourceChangedError
before the call returns anything, one in the agent's fails the completion.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
import ray

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.refs import ChecksumRef, ChunkRef, PendingChecksum, StatusRef
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.knobs import KNOBS
from air_transfer.core.packer import ChunkPacker
from air_transfer.core.plan import ChunkPlan
from air_transfer.observe import metrics
from air_transfer.transfer.agent_tasks import task_groups
from air_transfer.transfer.packing_service import PackingService
from air_transfer.transfer.strategies.base import Packed, PackRequest

#: Which chunks the caller stores itself (the agent stores the rest): every other
#: one, interleaved so that both parts advance through the checkpoint together.
Split = Callable[[ChunkPlan], bool]


def every_other(plan: ChunkPlan) -> bool:
    """The caller's part: the even chunks."""
    return plan.index % 2 == 0


def pack_shared(request: PackRequest, here: Split = every_other) -> Packed:
    """The chunks of ``request``: the agent's part submitted first (``store_chunks``,
    then ``checksum_stored`` of what it stored), then those ``here`` selects stored
    by this process and hashed here, of the stored bytes, while the agent works on
    its part. Returns once this process's part is stored and hashed;
    ``Packed.stored`` resolves once the agent's is stored (or raises what its
    packing raised), its checksums once taken."""
    plans = list(request.plans())
    agent = AgentClient()
    data: list[ChunkRef] = []
    statuses: list[StatusRef] = []
    for group in task_groups(plan for plan in plans if not here(plan)):
        k = len(group)
        returns = agent.calls(2 * k, PackingService.store_chunks, request.source, group)
        data += returns[:k]
        statuses += returns[k:]
    their_sums = iter(_checksums_of_stored(data, request.chunk_bytes))
    ours = [plan for plan in plans if here(plan)]
    stored = ChunkPacker().store_each(request.source, ours, ray.put)
    metrics.add_bytes("packed", sum(plan.length for plan in ours), "chunked")
    theirs = iter(data)
    mine = iter([(ref, checksum or _stored_checksum(ref)) for ref, checksum in stored])
    refs: list[ChunkRef] = []
    checksums: list[PendingChecksum] = []
    for plan in plans:
        ref, checksum = next(mine) if here(plan) else (next(theirs), next(their_sums))
        refs.append(ref)
        checksums.append(checksum)
    return Packed(refs, tuple(checksums), stored=tuple(statuses))


def _stored_checksum(ref: ChunkRef) -> str:
    """The checksum of a chunk this process stored, taken of the store's bytes (a
    zero-copy view of them)."""
    return chunk_checksum(ray.get(ref))


def _checksums_of_stored(refs: list[ChunkRef], chunk_bytes: int) -> list[ChecksumRef]:
    """The refs of the checksums of stored chunks ``refs``, in order: hashed by this
    node's agent, as many per task as a packing task takes."""
    agent = AgentClient()
    per_task = max(1, KNOBS.pack_task_bytes // chunk_bytes)
    sums: list[ChecksumRef] = []
    for start in range(0, len(refs), per_task):
        chunks = refs[start : start + per_task]
        stored = cast(list[np.ndarray], chunks)  # Ray resolves refs passed as arguments
        sums += agent.calls(len(chunks), PackingService.checksum_stored, *stored)
    return sums
