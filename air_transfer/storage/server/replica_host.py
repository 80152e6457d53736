"""Node storage replicas, the host: the registry of copies (``ReplicaRegistry``)
as the one actor of the cluster that runs it, on the head node, with repair in a
background thread (``repair.repair_forever``), its record saved in the cluster's
GCS key-value store (``GcsStore``), so that a registry started again after this
one died knows every copy that is stale. Started by the first process that uses a
replicated storage (``storage.client.replica_set``), by its dotted name.
"""

from __future__ import annotations

import threading

from air_transfer.cluster import _ray
from air_transfer.cluster.nodes import NAMESPACE
from air_transfer.storage.server.repair import repair_forever
from air_transfer.storage.server.replica_registry import ReplicaRegistry

#: The prefix of every record's key in the GCS key-value store.
PREFIX = "replicas/"


class GcsStore:
    """Replica records in the GCS key-value store (namespace ``air_transfer``): they
    live as long as the cluster, whatever happens to the registry's actor."""

    def save(self, key: str, record: bytes) -> None:
        _ray.kv_put(NAMESPACE, PREFIX + key, record)

    def load_all(self) -> dict[str, bytes]:
        saved = _ray.kv_items(NAMESPACE, PREFIX)
        return {k[len(PREFIX) :]: v for k, v in saved.items()}


class ReplicaHost(ReplicaRegistry):
    """The registry, repairing what is short of copies until the cluster ends."""

    def __init__(self) -> None:
        super().__init__(GcsStore())
        self._stop = threading.Event()
        self._repair = threading.Thread(
            target=repair_forever, args=(self, self._stop), name="air-transfer-repair", daemon=True
        )
        self._repair.start()

    def ready(self) -> bool:
        return True

    def stop_repair(self) -> None:
        """Repair no more in this registry (a registry started again repairs): for
        maintenance, and for tests that need a stale copy to stay stale."""
        self._stop.set()
