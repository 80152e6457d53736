"""Node storage on K nodes, Ray Train's copies: a report stored on every copy from
one packing, a restore from one fresh copy (failing over), and a stopped round's
reports reclaimed on every copy. ``train``'s uploads and hooks call these for a
replicated storage; the single-copy versions stay there.
"""

from __future__ import annotations

import logging
import os

from air_transfer.cluster.nodes import this_node_id
from air_transfer.cluster.refs import CheckpointRef
from air_transfer.config import TransferConfig
from air_transfer.core.confine import checked_path
from air_transfer.storage.client import replica_set
from air_transfer.storage.client.directory_reads import read_directory
from air_transfer.storage.client.replica_set import is_lost
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.copy import copy_tree
from air_transfer.storage.node_api import NodeCheckpoints
from air_transfer.storage.replica_wire import on_copy

logger = logging.getLogger(__name__)


def store_report(
    handler: ReplicatedHandler,
    path: str,
    ref: CheckpointRef,
    worker: str,
    config: TransferConfig,
) -> None:
    """Store the transferred checkpoint ``ref`` at ``path`` on every copy, each
    copy's agent writing it from the same chunk objects (and noting it under
    ``worker`` for ``reclaim``); returns once every live copy holds it. Whole on
    every copy, whatever ``config.incremental`` says: a copy reusing what it holds
    would need every copy to hold the same, which a stale copy being repaired does
    not."""
    rel = handler.rel(path)
    handler.change(
        [path],
        lambda link, root, op: link.submit(
            NodeCheckpoints.store_report, worker, ref, root, on_copy(root, rel), config, op
        ),
    )


def download(handler: ReplicatedHandler, path: str, local_path: str) -> bool:
    """Copy directory ``path`` into ``local_path`` from a fresh copy (this node's,
    else one in ``read_order``; the next when one is lost on the way); False for a
    file, or with ``placement="writer"`` (Ray copies it through the handler)."""
    if isinstance(handler, WriterPlacedHandler):
        return False  # Ray copies it file by file, each read from its holders
    rel, config = handler.rel(path), handler.config
    if handler.durable is not None and not handler.copies_holding(path):
        return False  # only in the durable tier: Ray copies it, file by file, verified
    copies, fresh, _, _ = handler.ensure()
    here = this_node_id()
    lost = []
    for node, root in replica_set.read_order(handler.key, copies, fresh, here):
        where, link = on_copy(root, rel), handler.link_to(node, root)
        try:
            if node == here:
                if not os.path.isdir(checked_path(root, where)):
                    return False
                copy_tree(where, local_path, config, root=root)
                return True
            read_directory(link, root, where, config, local_path)
            return True
        except NotADirectoryError:
            return False
        except Exception as e:
            if not is_lost(e):
                raise
            lost.append(node)
            logger.warning(
                "air-transfer: the copy on node %s was lost mid-restore of %s; trying another",
                node[:12],
                path,
            )
    raise ConnectionError(
        f"no live complete copy of {path!r} is left in node storage {handler.root!r} "
        f"(lost: {', '.join(n[:12] for n in lost) or 'none fresh'})"
    )


def reclaim(handler: ReplicatedHandler, workers: list[str], tracked: list[str]) -> list[str]:
    """Have every copy's agent end the stopped ``workers``' reports and delete what
    Train does not track; what was deleted (by any copy)."""
    copies, _, _, _ = handler.ensure()
    rels = [handler.rel(t) for t in tracked]
    deleted: set[str] = set()
    for node, root in copies:
        keep = [on_copy(root, r) for r in rels]
        try:
            link = handler.link_to(node, root)
            gone = link.call(NodeCheckpoints.reclaim_reports, root, workers, keep)
        except Exception as e:
            if not is_lost(e):
                raise
            continue
        deleted.update(os.path.relpath(g, root) for g in gone)
    return sorted(deleted)
