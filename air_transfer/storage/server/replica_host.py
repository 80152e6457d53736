"""Node storage replicas, the host: the registry of copies (``ReplicaRegistry``)
as the one actor of the cluster that runs it, on the head node, with background
threads that resolve the changes whose caller died (``dead_ops``), repair what
is short of copies (``repair``), give placed files (``placement="writer"``) K
holders that stay when nodes are lost or will go (``PLACED_PASS``, when
``placed_schedule`` says) and sweep the orphan placed blobs of writers that died
(``PLACED_SWEEP``, at ``SweepSchedule``'s pace), holding the claims that make
repairs of one placed file one at a time (``placed_claims``), its record saved in
the cluster's GCS key-value store (``GcsStore``, ``GcsClaims``), so that a
registry started again after this one died knows every copy that is stale (and
every claim). Started by the first process that uses a replicated storage
(``storage.client.replica_set``), from this class as the package root hands it down.
Callers reach it through one method, ``call``, naming a method of ``RegistryCalls``
(``cluster.rpc``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from air_transfer.cluster import _ray_core
from air_transfer.cluster.identity import Identity, this_process
from air_transfer.cluster.nodes import NAMESPACE, live_node_ids
from air_transfer.cluster.rpc import R, Services
from air_transfer.core.threads import Periodic
from air_transfer.storage.replica_wire import (
    CLAIM_PREFIX,
    PLACED_PASS,
    PLACED_SWEEP,
    RECORD_PREFIX,
    Owner,
)
from air_transfer.storage.server.dead_ops import resolve_dead
from air_transfer.storage.server.placed_claims import PlacedClaims
from air_transfer.storage.server.placed_schedule import (
    SWEEP_S,
    PlacedSchedule,
    SweepSchedule,
    sweep_every_s,
)
from air_transfer.storage.server.repair import repair_pass
from air_transfer.storage.server.replica_registry import ReplicaRegistry

logger = logging.getLogger(__name__)

#: How often the background thread looks (seconds).
POLL_S = 0.5


class GcsStore:
    """Replica records in the GCS key-value store (namespace ``air_transfer``): they
    live as long as the cluster, whatever happens to the registry's actor."""

    def save(self, key: str, record: bytes) -> None:
        _ray_core.kv_put(NAMESPACE, RECORD_PREFIX + key, record)

    def load_all(self) -> dict[str, bytes]:
        saved = _ray_core.kv_items(NAMESPACE, RECORD_PREFIX)
        return {k[len(RECORD_PREFIX) :]: v for k, v in saved.items()}


class GcsClaims:
    """Claims on placed blobs (``placed_claims``) in the same store, under their own
    prefix: a registry started again knows the repairs in progress."""

    def save(self, name: str, value: bytes) -> None:
        _ray_core.kv_put(NAMESPACE, CLAIM_PREFIX + name, value)

    def delete(self, name: str) -> None:
        _ray_core.kv_delete(NAMESPACE, CLAIM_PREFIX + name)

    def load_all(self) -> dict[str, bytes]:
        saved = _ray_core.kv_items(NAMESPACE, CLAIM_PREFIX)
        return {k[len(CLAIM_PREFIX) :]: v for k, v in saved.items()}


def owner_alive(owner: Owner) -> bool:
    """Whether the process ``owner`` may still run: its node live, and Ray not saying
    it is dead (Ray unable to tell: taken for alive while its node lives)."""
    return owner.node in live_node_ids() and _ray_core.worker_alive(owner.worker) is not False


class ReplicaHost(ReplicaRegistry):
    """The registry, resolving dead callers' changes and repairing what is short of
    copies until the cluster ends."""

    def __init__(self) -> None:
        super().__init__(GcsStore(), PlacedClaims(owner_alive, GcsClaims()))
        self._services = Services(self)
        # Four threads: a repair waits while a change is in flight, and the change of
        # a dead caller is in flight until the other resolves it; a placed file's
        # repair is a change, through this registry, and the sweep's listing of stubs
        # holds its storage (a change), which must not hold up a repair for long.
        self._placed = PlacedSchedule()
        self._sweeps = SweepSchedule(_sweep_setting())
        self._loops = [
            Periodic("air-transfer-dead-ops", lambda: POLL_S, self._resolve),
            Periodic("air-transfer-repair", lambda: POLL_S, self._repair),
            Periodic("air-transfer-placed", lambda: POLL_S, self._keep_placed),
            Periodic("air-transfer-placed-sweep", lambda: POLL_S, self._sweep_placed),
        ]
        for loop in self._loops:
            loop.start()

    def _resolve(self) -> None:
        _logged(lambda: resolve_dead(self, live_node_ids(), _ray_core.worker_alive))

    def _repair(self) -> None:
        # A copy on a node Ray says will go is made elsewhere first.
        _logged(lambda: repair_pass(self, live_node_ids(), frozenset(_ray_core.draining_nodes())))

    def _keep_placed(self) -> None:
        _logged(self._placed_pass)

    def _placed_pass(self) -> None:
        live, now = live_node_ids(), time.monotonic()
        nodes = (frozenset(live), frozenset(_ray_core.draining_nodes()) & frozenset(live))
        if not self._placed.due(nodes, now):
            return
        storages = []
        for key in self.keys():
            view = self.view(key)
            if view is not None and set(view[1]) & nodes[0]:  # none readable: not ours
                storages.append((key, self.template(key), view[3]))
        try:
            failed = PLACED_PASS.get()(storages, set(nodes[0]), set(nodes[1]))
        except Exception as e:
            failed = [f"every storage ({type(e).__name__}: {e})"]
            raise
        finally:
            if self._placed.ran(nodes, now, failed):
                logger.error(
                    "air-transfer: gave up giving %s K live holders that stay after %d "
                    "passes in a row failed; tried again when nodes change",
                    ", ".join(failed),
                    self._placed.failures,
                )

    def _sweep_placed(self) -> None:
        _logged(self._sweep_pass)

    def _sweep_pass(self) -> None:
        live, now = frozenset(live_node_ids()), time.monotonic()
        if not self._sweeps.due(live, now):
            return
        self._sweeps.ran(live, now)  # a failed sweep waits for the next turn too
        storages = []
        for key in self.keys():
            view = self.view(key)
            if view is not None and set(view[1]) & live:  # none readable: not ours
                storages.append((key, self.template(key), view[3]))
        PLACED_SWEEP.get()(storages)

    def call(self, method: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``method(*args, **kwargs)`` of this registry, named by the caller
        (``RegistryCalls``, ``cluster.rpc``)."""
        result: R = self._services.call(method, *args, **kwargs)
        return result

    def ready(self) -> bool:
        return True

    def identity(self) -> Identity:
        """The air-transfer version and settings this registry runs with."""
        return this_process()

    def stop_repair(self) -> None:
        """Repair no more in this registry (a registry started again repairs): for
        maintenance, and for tests that need a stale copy to stay stale. Changes
        whose caller died are no longer resolved either."""
        for loop in self._loops:
            loop.stop()


def _sweep_setting() -> float:
    """``sweep_every_s``, a bad setting logged (naming it) and ``SWEEP_S`` taken: the
    registry serves every storage, and must start whatever the setting says."""
    try:
        return sweep_every_s()
    except ValueError as e:
        logger.error("air-transfer: %s; every %.0f s taken", e, SWEEP_S)
        return SWEEP_S


def _logged(job: Callable[[], object]) -> None:
    """``job()``, its error logged: a pass that fails never ends its loop."""
    try:
        job()
    except Exception as e:
        logger.warning("air-transfer: replica registry pass failed: %r", e)
