"""Node storage with ``placement="writer"``, the background work of the replica
registry's actor, with no call by the user: every placed file of every replicated
storage given K live holders that stay (``keep_placed``, run whenever the live or
draining nodes change: ``storage.server.placed_schedule`` says when; the package
root hands it down as ``replica_wire.PLACED_PASS``; the repair itself is
``placed_repair``'s, the one ``repair_holders`` makes), and the orphan blobs of
writers that died swept (``sweep_dead_writers``, handed down as
``replica_wire.PLACED_SWEEP``, at the pace ``placed_schedule.SweepSchedule`` sets).

A leaving node's files go first, across every storage, the newest first, so that
the latest checkpoint has K copies before the node's deadline.
"""

from __future__ import annotations

import json
import logging

from air_transfer.cluster import _ray_core
from air_transfer.cluster.nodes import NAMESPACE
from air_transfer.storage.client.placed_repair import Nodes, Repair, keep_holders, plan
from air_transfer.storage.client.placed_sweep import sweep_placed
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.replica_wire import PLACED_PREFIX, key_parts

logger = logging.getLogger(__name__)


def keep_placed(
    storages: list[tuple[str, str, int]], live: set[str], leaving: set[str]
) -> list[str]:
    """Repair the placed files of ``storages`` (each ``(key, replica root template,
    K)``) that name a node not ``live`` or ``leaving``: the files (or storages) that
    could not be repaired, each logged naming it and why. Only a storage that its
    users made known as writer-placed (``PLACED_PREFIX``) is looked into, with the
    failure domain they gave it."""
    nodes = Nodes(frozenset(live), frozenset(leaving) & frozenset(live))
    repairs: list[Repair] = []
    failed: list[str] = []
    for key, template, wanted in storages:
        try:
            handler = _placed_handler(key, template, wanted)
            if handler is not None:
                repairs += plan(handler, handler.root, nodes)
        except Exception as e:
            failed.append(key)
            logger.warning(
                "air-transfer: could not list the placed files of node storage %s "
                "(%s: %s); tried again later",
                key,
                type(e).__name__,
                e,
            )
    return failed + keep_holders(repairs, nodes)


def sweep_dead_writers(storages: list[tuple[str, str, int]]) -> list[str]:
    """The orphan blobs of ``storages`` (as ``keep_placed``'s) that a writer proven
    dead declared and no stub names, removed from every live node, by the proof of
    ``placed_sweep`` (its ``after_death`` sweep: a storage none of whose writers is
    dead costs two listings per node); each storage's removals logged. The storages
    whose sweep failed (logged; tried again at the next sweep)."""
    failed = []
    for key, template, wanted in storages:
        try:
            handler = _placed_handler(key, template, wanted)
            swept = [] if handler is None else sweep_placed(handler, after_death=True)
        except Exception as e:
            failed.append(key)
            logger.warning(
                "air-transfer: could not sweep the orphan placed bytes of node storage "
                "%s (%s: %s); tried again later",
                key,
                type(e).__name__,
                e,
            )
            continue
        removed = [s for s in swept if s.action == "removed" and s.kind == "placed"]
        others = [s for s in swept if s.action.startswith("failed")]
        if removed:
            logger.info(
                "air-transfer: removed %d orphan placed blobs (%d bytes) of node storage "
                "%s, left by writers that died: %s",
                len(removed),
                sum(s.nbytes for s in removed),
                key,
                ", ".join(s.path for s in removed),
            )
        for s in others:
            logger.warning("air-transfer: orphan placed bytes %s stay: %s", s.path, s.action)
    return failed


def _placed_handler(key: str, template: str, wanted: int) -> WriterPlacedHandler | None:
    """The handler of storage ``key`` if its users made it known as writer-placed
    (``PLACED_PREFIX``), with the failure domain they gave it; else None."""
    node, root = key_parts(key)
    settings = _ray_core.kv_get(NAMESPACE, PLACED_PREFIX + key)
    if settings is None:  # not writer-placed: nothing of it is placed
        return None
    domain = json.loads(settings)["failure_domain"]
    return WriterPlacedHandler(
        node, root, replicas=wanted, replica_root=template, failure_domain=domain
    )
