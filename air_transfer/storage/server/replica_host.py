"""Node storage replicas, the host: the registry of copies (``ReplicaRegistry``)
as the one actor of the cluster that runs it, on the head node, with repair in a
background thread (``repair.repair_forever``). Started by the first process that
uses a replicated storage (``storage.client.replica_set``), by its dotted name.
"""

from __future__ import annotations

import threading

from air_transfer.storage.server.repair import repair_forever
from air_transfer.storage.server.replica_registry import ReplicaRegistry


class ReplicaHost(ReplicaRegistry):
    """The registry, repairing what is short of copies until the cluster ends."""

    def __init__(self) -> None:
        super().__init__()
        self._stop = threading.Event()
        self._repair = threading.Thread(
            target=repair_forever, args=(self, self._stop), name="air-transfer-repair", daemon=True
        )
        self._repair.start()

    def ready(self) -> bool:
        return True
