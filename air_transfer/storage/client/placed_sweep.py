"""Node storage with ``placement="writer"``: the sweep of orphan blobs, those no stub
names and no live writer may still name, from every live node's placed root
(``sweep_placed``; ``WriterPlacedHandler.sweep_placed``, ``air-transfer clean``).

Each step is what ``placed_pending`` says makes it safe: on every live node, the
storage's blob directory listed twice through its agent (the blobs, then the pending
markers); the writers of the markers judged (``cluster.liveness.dead``); only if some
blob has no live writer, the stubs listed with the whole storage held in the replica
registry (as a change of its root: every change in flight ends first, none starts
until the listing is done; a syncing copy then re-checks the whole tree); then each
orphan removed through its holder's agent, and after it its dead writer's marker.
A holder whose agent does not answer is left for a later sweep.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import uuid
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from air_transfer.cluster.liveness import dead
from air_transfer.cluster.nodes import live_node_ids
from air_transfer.storage.client import replica_set
from air_transfer.storage.client.placed_pending import (
    HolderScan,
    Swept,
    is_blob_name,
    judge,
    needs_names,
    parse_marker,
)
from air_transfer.storage.client.placed_storage import PlacedStorage
from air_transfer.storage.client.replica_set import is_lost
from air_transfer.storage.node_api import NodeMetadata
from air_transfer.storage.placed_record import (
    SUMS_SUFFIX,
    blob_dir,
    placed_root,
)
from air_transfer.storage.replica_wire import RegistryCalls

if TYPE_CHECKING:
    from air_transfer.core.process_locks import Process
    from air_transfer.storage.client.streams import AgentLink

logger = logging.getLogger(__name__)


def sweep_placed(
    handler: PlacedStorage, dry_run: bool = False, after_death: bool = False
) -> list[Swept]:
    """Every orphan blob of ``handler``'s storage on its live nodes (and every dead
    writer's marker), judged and, unless ``dry_run``, removed; a live writer's blob
    listed as kept. Named blobs are not listed. ``after_death`` (the registry's
    background sweep): nothing is judged, and the stubs are not listed, unless some
    writer that declared a blob is proven dead (two listings per node, no more)."""
    handler.ensure()
    scans = _scan(handler, blob_dir(handler.key))
    writers = {p for s in scans for ms in s.markers.values() for _, p in ms}
    gone: set[Process] = dead(writers) if writers else set()
    if after_death and not gone:
        return []
    if not needs_names(scans, gone):
        return [v for s in scans for v in judge(s, gone, frozenset())]
    named = _named(handler)
    found = [v for s in scans for v in judge(s, gone, named)]
    if dry_run:
        return found
    return _remove(handler, found)


def _scan(handler: PlacedStorage, directory: str) -> list[HolderScan]:
    """Each live node's listing of ``directory`` under its placed root: its blobs,
    then (a second listing) its markers."""
    links = []
    for node in sorted(live_node_ids()):
        root = placed_root(handler.replica_root, node)
        links.append((node, root, handler.placed_link(node, root)))
    firsts = _listings(links, directory)
    seconds = _listings([x for x in links if x[0] in firsts], directory)
    scans = []
    for node, root, _ in links:
        if node not in seconds:
            continue
        blobs = {
            name: int(size or 0)
            for name, kind, size, _ in firsts[node]
            if kind == pafs.FileType.File.value and is_blob_name(name)
        }
        markers: dict[str, list[tuple[str, Process]]] = {}
        for name, kind, _, _ in seconds[node]:
            parsed = parse_marker(name) if kind == pafs.FileType.Directory.value else None
            if parsed is not None:
                markers.setdefault(parsed[0], []).append((name, parsed[1]))
        held = {b: tuple(ms) for b, ms in markers.items()}
        scans.append(HolderScan(node, root, directory, blobs, held))
    return scans


def _listings(
    links: list[tuple[str, str, AgentLink]], directory: str
) -> dict[str, list[tuple[str, int, int | None, int | None]]]:
    """Each node's listing of ``directory`` (none: its directory is missing), from the
    agents that answer."""
    calls = [
        (node, link, link.submit(NodeMetadata.fs_list, root, f"{root}/{directory}", False, True))
        for node, root, link in links
    ]
    out = {}
    for node, link, call in calls:
        try:
            out[node] = [(posixpath.basename(r), t, s, m) for r, t, s, m in link.wait(call)]
        except Exception as e:
            if not is_lost(e):
                raise
            logger.info("air-transfer: the placed root on %s is not swept: %s", node[:12], e)
    return out


def _named(handler: PlacedStorage) -> frozenset[str]:
    """The blob of every stub of the storage, listed on a fresh copy while the
    replica registry holds the whole storage (see the module)."""
    op = uuid.uuid4().hex
    replica_set.begin(handler.key, [""], op)
    try:
        return frozenset(record.blob for _, record, _ in handler.placed_under(handler.root))
    finally:
        replica_set.call(RegistryCalls.end, handler.key, op, [], [])


def _remove(handler: PlacedStorage, found: list[Swept]) -> list[Swept]:
    """Each ``would remove`` entry removed through its holder's agent, in order (a
    blob before its marker); the entries with what was done."""
    out = []
    for v in found:
        if v.action != "would remove":
            out.append(v)
            continue
        root = placed_root(handler.replica_root, v.node)
        link = handler.placed_link(v.node, root)
        method = NodeMetadata.fs_delete_file if v.kind == "placed" else NodeMetadata.fs_delete_dir
        try:
            link.call(method, root, v.path, "")
            action = "removed"
            if v.kind == "placed":  # and the blob's checksums, if it has them
                with contextlib.suppress(FileNotFoundError):
                    link.call(method, root, v.path + SUMS_SUFFIX, "")
        except FileNotFoundError:
            action = "kept: removed meanwhile"
        except Exception as e:
            action = f"failed: {type(e).__name__}: {e}"
        out.append(Swept(v.node, v.path, v.kind, v.nbytes, action))
    return out
