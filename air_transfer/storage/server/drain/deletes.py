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
from air_transfer.storage.server.drain import manifests
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
        with drain.lock:
            drain.waiting_deletes = {}
        return
    sizes = _sizes_behind(drain)
    going: list[tuple[str, str, list[str]]] = []
    waiting: dict[str, str] = {}
    for key, rel in sorted(pending.items(), key=lambda kv: kv[1]):
        if not rel:
            raise ValueError("the durable tier's base itself is never deleted")
        named = _named(drain, rel)
        if named:
            waiting[rel] = f"{named} still names it"
            continue
        if _source_of_pending(drain, key, rel, sizes):
            waiting[rel] = "a file not uploaded yet may be copied from it"
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
    if going:
        manifests.write(drain, tree, scan_storage(drain.root))
    for key, rel, dirs in going:
        with drain.lock:
            parent = parent_and_name(rel)[0]
            if parent in tree.dirty:  # its directory's manifest still names it
                waiting[rel] = f"the manifest of {parent or '(the base)'} waits for its files"
                continue
        removed = _delete_objects(drain, rel)
        for rel_dir in dirs:
            drain.objects.delete(manifest_path(drain.target, rel_dir))
        drain.journal.remove(removed)
        drain.tombstones.remove(key)
        drain.deferred.pop(key, None)
    with drain.lock:
        drain.waiting_deletes = waiting


def _delete_objects(drain: Drain, rel: str) -> list[str]:
    """Delete the tier's objects at and under ``rel`` that node storage does not hold
    now; their relative paths. (On an object store a listing of a file's key is
    empty: what ``rel`` itself is comes first.)"""
    fs, target = drain.target.filesystem, drain.target
    [top] = fs.get_file_info([target.path(rel)])
    found = [top] if top.type == pafs.FileType.File else []
    if top.type == pafs.FileType.Directory:
        found = [info for _, info in list_below(fs, target.path(rel), missing_ok=True)]
    removed = []
    for info in found:
        if info.type != pafs.FileType.File:
            continue
        inner = target.rel(info.path)
        if not exists(drain.root, inner):
            drain.objects.delete(info.path)
            removed.append(inner)
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


def _named(drain: Drain, rel: str) -> str:
    """Whether a file uploaded last, outside ``rel``, still names it: one in a
    directory above ``rel`` whose bytes hold ``rel``'s path from that directory (Ray
    Train's run state names its checkpoints' directories, DCP's ``.metadata`` its
    shards, each relative to where it lies), as a name of its own: not the tail of a
    longer path (a metric that recorded where a run restored from names no
    checkpoint Train tracks) nor the head of a longer name (``ckpt_1`` in
    ``ckpt_10``): its path, or ''."""
    with drain.lock:
        last = dict(drain.last_files)
    for path, content in last.items():
        if _under(path, rel):
            continue
        where = posixpath.dirname(path)
        if where and not rel.startswith(where + "/"):
            continue
        inner = rel[len(where) + 1 :] if where else rel
        if inner and _mentions(content, inner.encode()):
            return path
    return ""


#: Bytes a name in a path is made of: one beside a mention makes it part of a longer one.
_NAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _mentions(content: bytes, name: bytes) -> bool:
    """Whether ``content`` holds ``name`` as a path of its own: not preceded by a
    name byte or ``/``, not followed by a name byte (``/`` may follow: a file in it)."""
    start = content.find(name)
    while start >= 0:
        end = start + len(name)
        before = content[start - 1] if start else None
        after = content[end] if end < len(content) else None
        if (before is None or (before not in _NAME_BYTES and before != ord("/"))) and (
            after is None or after not in _NAME_BYTES
        ):
            return True
        start = content.find(name, start + 1)
    return False
