"""Node storage with ``placement="writer"``, the background pass: every placed file
of every replicated storage given K live holders that stay, with no call by the
user (``keep_placed``). The replica registry's actor runs it whenever the live or
draining nodes change (``storage.server.placed_schedule`` says when; the package root
hands this function down to it as ``replica_wire.PLACED_PASS``); the repair itself
is ``placed_repair``'s, the one ``repair_holders`` makes.

A leaving node's files go first, across every storage, the newest first, so that
the latest checkpoint has K copies before the node's deadline.
"""

from __future__ import annotations

import json
import logging

from air_transfer.cluster import _ray_core
from air_transfer.cluster.nodes import NAMESPACE
from air_transfer.storage.client.placed_repair import Nodes, Repair, keep_holders, plan
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
        node, root = key_parts(key)
        try:
            settings = _ray_core.kv_get(NAMESPACE, PLACED_PREFIX + key)
            if settings is None:  # not writer-placed: nothing of it is placed
                continue
            domain = json.loads(settings)["failure_domain"]
            handler = WriterPlacedHandler(
                node, root, replicas=wanted, replica_root=template, failure_domain=domain
            )
            repairs += plan(handler, root, nodes)
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
