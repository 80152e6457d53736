"""Which of a replicated storage's copies drains it into the durable tier: the one
``replica_wire.drain_leader`` names, from the registry's record of the storage in
the GCS (which copies are fresh). A stale copy never drains (it may lack a change);
when the leading copy's node goes, the registry marks it stale and the next fresh
copy's drain takes over, from the tier's manifests and the journal."""

from __future__ import annotations

from collections.abc import Callable

from air_transfer.cluster import _ray_core
from air_transfer.cluster.nodes import NAMESPACE
from air_transfer.storage.replica_wire import RECORD_PREFIX, drain_leader
from air_transfer.storage.server.replica_record import Replicated


def replica_leads(key: str, node: str, primary: str) -> Callable[[], bool]:
    """Whether the copy on ``node`` of replicated storage ``key`` (whose storage node
    is ``primary``) leads its drain now."""

    def leads() -> bool:
        saved = _ray_core.kv_items(NAMESPACE, RECORD_PREFIX + key).get(RECORD_PREFIX + key)
        if saved is None:  # not registered yet: the storage node's copy
            return node == primary
        fresh = Replicated.from_record(saved).fresh
        return drain_leader(fresh, primary, _ray_core.draining_nodes()) == node

    return leads
