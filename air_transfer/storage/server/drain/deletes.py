"""Deletes that node storage acknowledged, applied to the durable tier after a pass's
uploads: the manifests first (so no manifest names what goes), then the objects,
then the journal's entries and the tombstone.

A delete waits while a file uploaded last still names it (Ray Train saves its run
state before it deletes: the next pass applies it), while a file not uploaded yet may
be copied from what it deletes (``DEFER_PASSES`` passes at most), and while the
manifest of its directory cannot be written (another file there is not in the tier
yet). What node storage holds again at the deleted path (made anew after the delete)
stays: the pass uploaded it. The objects to delete are found by listing the deleted
path in the tier: a listing is trusted to find what to remove, never what to read.
"""

from __future__ import annotations

import posixpath

import pyarrow.fs as pafs

from air_transfer.core.fs_listing import list_below
from air_transfer.storage.durable.records import manifest_path, parent_and_name
from air_transfer.storage.server.drain.scan import exists, scan_storage
from air_transfer.storage.server.drain.state import DrainParts as Drain
from air_transfer.storage.server.drain.state import under as _under

#: Passes a delete may wait for newer files that may be copies of what it deletes.
DEFER_PASSES = 3


def apply(drain: Drain) -> None:
    """Apply every pending delete that may go now (see the module)."""
    with drain.deletes_lock:  # every delete noted so far is done in node storage
        pending = drain.tombstones.pending()
        present = {key: exists(drain.root, rel) for key, rel in pending.items()}
    tree = drain.tree
    if not pending or tree is None:
        return
    sizes = _sizes_behind(drain)
    going: list[tuple[str, str, list[str]]] = []
    for key, rel in sorted(pending.items(), key=lambda kv: kv[1]):
        if not rel:
            raise ValueError("the durable tier's base itself is never deleted")
        if _named(drain, rel) or _source_of_pending(drain, key, rel, sizes):
            continue
        with drain.lock:
            if present[key]:
                gone = [f for f, _ in tree.files() if _under(f, rel) and not exists(drain.root, f)]
                dirs: list[str] = []
                for f in gone:
                    tree.remove(f)
            else:
                gone, dirs = tree.remove(rel)
            for f in gone:
                drain.versions.pop(f, None)
                drain.last_files.pop(f, None)
        going.append((key, rel, dirs))
    if not going:
        return
    drain.write_manifests(tree, scan_storage(drain.root))
    for key, rel, dirs in going:
        with drain.lock:
            if parent_and_name(rel)[0] in tree.dirty:
                continue  # its directory's manifest still names it: a later pass
        removed = _delete_objects(drain, rel)
        for rel_dir in dirs:
            drain.objects.delete(manifest_path(drain.target, rel_dir))
        drain.journal.remove(removed)
        drain.tombstones.remove(key)
        drain.deferred.pop(key, None)


def _delete_objects(drain: Drain, rel: str) -> list[str]:
    """Delete the tier's objects at and under ``rel`` that node storage does not hold
    now; their relative paths."""
    fs, target = drain.target.filesystem, drain.target
    try:
        found = [info for _, info in list_below(fs, target.path(rel), missing_ok=True)]
    except NotADirectoryError:
        found = fs.get_file_info([target.path(rel)])
    removed = []
    for info in found:
        if info.type != pafs.FileType.File:
            continue
        inner = target.rel(info.path)
        if not exists(drain.root, inner):
            drain.objects.delete(info.path)
            removed.append(inner)
    [top] = fs.get_file_info([target.path(rel)])
    if top.type == pafs.FileType.Directory and not exists(drain.root, rel):
        fs.delete_dir(target.path(rel))
    return removed


def _sizes_behind(drain: Drain) -> set[int]:
    """The sizes of node storage's files the tier lacks now (written during the
    pass): files with the bytes of one of them may serve as its copy's source."""
    files = scan_storage(drain.root).files.values()
    with drain.lock:
        return {s.size for s in files if drain.versions.get(s.rel) != s.version}


def _source_of_pending(drain: Drain, key: str, rel: str, sizes: set[int]) -> bool:
    """Whether to keep ``rel``'s files in the tier one more pass: a file written
    since the pass began, not uploaded yet, has the size of one of them (so it may
    be copied from it inside the tier rather than sent: reports faster than the
    tier, pruned by ``num_to_keep``), for at most ``DEFER_PASSES`` passes."""
    if not sizes or drain.tree is None:
        return False
    with drain.lock:
        held = {r.size for p, r in drain.tree.files() if _under(p, rel)}
    if not held & sizes:
        return False
    deferred = drain.deferred.get(key, 0)
    if deferred >= DEFER_PASSES:
        return False
    drain.deferred[key] = deferred + 1
    return True


def _named(drain: Drain, rel: str) -> bool:
    """Whether a file uploaded last, outside ``rel``, still names it."""
    name = posixpath.basename(rel).encode()
    with drain.lock:
        last = dict(drain.last_files)
    return bool(name) and any(name in c for p, c in last.items() if not _under(p, rel))
