"""What the drain counts durable, asked of the tier again: ``confirm_all`` (a pass that
``wait_durable`` or the scrub asked for: a HEAD of every object and manifest the drain
wrote, and with ``scrub_bytes_per_s`` every stored byte read back and checked against
its chunk checksums, at that rate), and ``behind`` (what node storage holds that the
tier does not, now; asked of the tier itself for ``storage_state``).

What the tier lost is marked so (``DrainParts.lost``): no longer counted, never a
copy's source, and sent again by the pass where node storage still holds it.
"""

from __future__ import annotations

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.threads import pool
from air_transfer.storage.durable import codecs
from air_transfer.storage.durable.records import FileRecord, manifest_path
from air_transfer.storage.server.drain import files
from air_transfer.storage.server.drain.scan import scan_storage
from air_transfer.storage.server.drain.state import DrainParts, under
from air_transfer.storage.server.drain.tree import TierTree

#: Paths named in a status (the first ones).
SHOWN = 20
#: HEAD requests in flight at once.
HEADS = 16


def confirm_all(drain: DrainParts, tree: TierTree) -> None:
    """Ask the tier for every object the drain counts durable and every manifest it
    wrote (and read back the bytes, with ``scrub_bytes_per_s``): what it lost is no
    longer counted, and a lost manifest is written again once its directory is whole."""
    with drain.lock:
        counted = [(r, rec) for r, rec in tree.files() if r in drain.versions]
        dirs = [(d, tree.tag(d)) for d in tree.dirs() if tree.tag(d)]
    with pool("air-transfer-confirm", HEADS) as heads:
        found = list(heads.map(lambda i: files.confirm(drain.objects, *i), counted))
        manifests = list(
            heads.map(lambda d: drain.objects.head(manifest_path(drain.target, d[0])), dirs)
        )
    for (rel, _), ok in zip(counted, found, strict=True):
        if ok is None:
            drain.lost(rel, "it is missing, cut short or replaced")
    for (rel_dir, tag), head in zip(dirs, manifests, strict=True):
        if head is None or (tag != "loaded" and head.tag != tag):
            with drain.lock:
                tree.dirty.add(rel_dir)  # written again once whole
    rate = drain.settings.scrub_bytes_per_s
    if rate is not None:
        limit = files.RateLimit(rate)
        for (rel, record), ok in zip(counted, found, strict=True):
            if ok is not None and not _reads_back(drain, rel, record, limit):
                drain.lost(rel, "its bytes read back do not match their checksums")


def _reads_back(drain: DrainParts, rel: str, record: FileRecord, limit: files.RateLimit) -> bool:
    """Whether every chunk of the object ``rel`` decodes to its recorded checksum."""
    path = drain.target.path(rel)
    for index, expected in enumerate(record.sums):
        offset, length = record.stored_range(index)
        limit.take(length)
        try:
            stored = drain.objects.read(path, offset, length)
            data = codecs.decode(record.codec, stored, record.chunk_length(index))
        except (OSError, ValueError):
            return False
        if len(stored) != length or chunk_checksum(data) != expected:
            return False
    return True


def behind(
    drain: DrainParts, rel: str | None, asked: bool
) -> tuple[int, tuple[str, ...], bool | None]:
    """``(bytes, first paths, durable)`` of node storage's files (at or under ``rel``,
    if given) that the tier does not hold as they are now; ``durable``, for ``rel``:
    none is behind, each asked of the tier itself with ``asked``."""
    held = [s for r, s in scan_storage(drain.root).files.items() if rel is None or under(r, rel)]
    with drain.lock:
        missing = [s for s in held if drain.versions.get(s.rel) != s.version]
        tree = drain.tree
        records = {} if tree is None else {s.rel: tree.record(s.rel) for s in held}
    if asked and rel is not None and not missing:
        counted = [(r, rec) for r, rec in records.items() if rec is not None]
        with pool("air-transfer-confirm", HEADS) as heads:
            found = list(heads.map(lambda i: files.confirm(drain.objects, *i), counted))
        lost = {r for (r, _), ok in zip(counted, found, strict=True) if ok is None}
        for gone in sorted(lost):
            drain.lost(gone, "it is missing, cut short or replaced")
        missing = [s for s in held if s.rel in lost]
    pending = tuple(sorted(s.rel for s in missing))[:SHOWN]
    return sum(s.size for s in missing), pending, None if rel is None else not missing
