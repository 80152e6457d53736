"""Node storage with ``placement="writer"`` under Ray Train: a report's directory
noted on every copy as the worker's (``note_report``), so that a round Train stops
before it tracks the checkpoint leaves nothing in storage (``reclaim``): the copies
delete its stubs (``NodeCheckpoints.reclaim_placed_reports``, which hands back the
records of the stubs it deleted) and then their holders' bytes are deleted.

A placed report is copied by Ray Train itself, file by file through the filesystem
(``train.plan.Route.RAY``), so no agent stores it: without its note, no copy's
report ledger would know the directory was a report's.
"""

from __future__ import annotations

import logging
import os

from air_transfer.storage.client.replica_set import is_lost
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.node_api import NodeCheckpoints
from air_transfer.storage.placed_record import RECORD_BYTES, PlacedRecord, decode
from air_transfer.storage.replica_wire import on_copy

logger = logging.getLogger(__name__)


def note_report(handler: WriterPlacedHandler, path: str, worker: str) -> None:
    """Make the report directory ``path`` of Ray Train worker ``worker`` on every
    copy, noted there as the worker's (a copy lost meanwhile is skipped)."""
    copies, _, _, _ = handler.ensure()
    rel = handler.rel(path)
    for node, root in copies:
        try:
            link = handler.link_to(node, root)
            link.call(NodeCheckpoints.note_report_dir, root, worker, on_copy(root, rel))
        except Exception as e:
            if not is_lost(e):
                raise


def reclaim(handler: WriterPlacedHandler, workers: list[str], tracked: list[str]) -> list[str]:
    """Have every copy's agent end the stopped ``workers``' reports and delete what
    Train does not track, then delete the holders' bytes of every placed file among
    them; what was deleted (by any copy)."""
    copies, _, _, _ = handler.ensure()
    rels = [handler.rel(t) for t in tracked]
    deleted: set[str] = set()
    records: dict[str, PlacedRecord] = {}
    for node, root in copies:
        keep = [on_copy(root, r) for r in rels]
        try:
            link = handler.link_to(node, root)
            gone, stubs = link.call(
                NodeCheckpoints.reclaim_placed_reports, root, workers, keep, RECORD_BYTES
            )
        except Exception as e:
            if not is_lost(e):
                raise
            continue
        deleted.update(os.path.relpath(g, root) for g in gone)
        for where, size, head in stubs:
            try:
                record = decode(head, size, where, handler.replica_root)
            except ValueError as e:  # not ours to follow: its bytes stay where they are
                logger.warning("air-transfer: %s", e)
                continue
            records[record.blob] = record
    for record in records.values():
        handler.delete_record(record)
    return sorted(deleted)
