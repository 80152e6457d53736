"""Step 6 of a drain pass (``passes``): the manifest of each changed directory
written once it is whole, deepest first, and the journal then told to forget what
the manifest names.

A module of its own, on the drain's parts (``state.DrainParts``) as ``deletes``
and ``confirm`` are, because both the pass and ``deletes`` (after the tier drops a
file) write manifests, and neither should import the other for it.
"""

from __future__ import annotations

from air_transfer.storage.durable.records import child, manifest_path
from air_transfer.storage.server.drain.scan import Scanned
from air_transfer.storage.server.drain.state import DrainParts
from air_transfer.storage.server.drain.tree import TierTree


def write(drain: DrainParts, tree: TierTree, scanned: Scanned) -> None:
    """Write the manifest of each changed directory that is whole (every file
    node storage holds under it confirmed at its version), deepest first."""
    with drain.lock:
        behind = {r for r, s in scanned.files.items() if drain.versions.get(r) != s.version}
        order = [d for d in tree.dirty_deepest_first() if not _any_under(behind, d)]
    for rel_dir in order:
        with drain.lock:
            if not tree.has_dir(rel_dir):
                continue
            manifest = tree.to_write(rel_dir)
        tag = drain.objects.put(manifest_path(drain.target, rel_dir), manifest.to_bytes())
        drain.reads.remember(rel_dir, manifest)
        with drain.lock:
            tree.written(rel_dir, tag)
        named = {child(rel_dir, n) for n in manifest.files}
        with drain.lock:
            done, drain.journaled = drain.journaled & named, drain.journaled - named
        drain.journal.remove(sorted(done))


def _any_under(paths: set[str], rel_dir: str) -> bool:
    if not rel_dir:
        return bool(paths)
    prefix = rel_dir + "/"
    return any(p.startswith(prefix) for p in paths)
