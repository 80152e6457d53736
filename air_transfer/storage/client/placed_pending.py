"""Node storage with ``placement="writer"``: which holders' blobs no stub names and no
live writer may still name (*orphans*), judged by proof, never by age. Plain Python:
the sweep that lists and removes them is ``placed_sweep``.

A writer leaves an orphan when it dies between its holders' commits and its stub's
commit (or when a delete of the bytes a stub stopped naming fails on a lost holder).
Between those commits the blob is named by nothing, and a sweep must not take it
while its writer may still commit the stub. So a writer *declares* each blob before
it exists: on every holder, before the blob's staging file is opened, it makes a
pending marker beside it (``marker``: an empty directory
``<blob>.writer-<node>-<dev>-<ino>-<lock>`` whose name is the writer process, as
``core.process_locks`` names it: the lock it holds for its life on its node). Only
once its stub is committed (or its blobs deleted) does it remove the markers.

A blob is judged (``judge``) from two listings of its holder's directory, the blobs
first, the markers after, then from the stubs:

- a marker of a writer not proven dead (``cluster.liveness.dead``: its node left, or
  that node's agent took its lock) keeps the blob, whatever its age;
- else, a blob is removed only if no stub of the storage names it, in a listing of
  the stubs made after the markers were listed. A marker is made before its blob and
  removed after its stub's commit, so a blob seen with no marker in the later listing
  had its stub (if it got one) committed before that listing: it is in the stubs'.
  No new stub can name it afterwards: new writes use new names, a move keeps names,
  a repair copies only blobs a stub names. The stubs are listed while the replica
  registry holds the whole storage (no commit, move or delete in flight, a dead
  writer's resolved first), on one fresh copy: every fresh copy has taken every
  change, and a stale copy is never read.

A blob is matched by its name alone, not by holder: a blob a repair is copying to a
new holder is named by the stub it repairs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from air_transfer.core.process_locks import Process, ProcessLock

_BLOB = re.compile(r"[0-9a-f]{32}")
_MARKER = re.compile(r"([0-9a-f]{32})\.writer-([0-9a-f]{16,128})-(\d+)-(\d+)-([0-9a-f]{32})")
_LOCK_SUFFIX = ".lock"


def marker(blob: str, writer: Process) -> str:
    """The pending marker of ``blob`` (``<dir>/<name>``, as ``blob_path`` makes it)
    written by ``writer``: its path under a placed root."""
    stem = writer.lock.name.removesuffix(_LOCK_SUFFIX)
    dev, ino = writer.lock.directory
    name = f"{blob}.writer-{writer.node_id}-{dev}-{ino}-{stem}"
    if "/" not in blob or not _MARKER.fullmatch(name.rsplit("/", 1)[1]):
        raise ValueError(f"cannot name the pending marker of blob {blob!r} by {writer}")
    return name


def parse_marker(name: str) -> tuple[str, Process] | None:
    """``(blob name, writer)`` of a pending marker's name (no directory); None for
    any other name."""
    m = _MARKER.fullmatch(name)
    if m is None:
        return None
    blob, node, dev, ino, stem = m.groups()
    return blob, Process(node, ProcessLock((int(dev), int(ino)), stem + _LOCK_SUFFIX))


def is_blob_name(name: str) -> bool:
    """Whether ``name`` (no directory) is a blob's, as ``blob_path`` makes it."""
    return _BLOB.fullmatch(name) is not None


@dataclass(frozen=True)
class HolderScan:
    """One holder's directory of a storage's blobs (``root/dir``): its blobs and their
    sizes from a first listing, the pending markers (blob name -> marker names and
    writers) from a second one, made after it."""

    node: str
    root: str
    dir: str
    blobs: dict[str, int]
    markers: dict[str, tuple[tuple[str, Process], ...]]


@dataclass(frozen=True)
class Swept:
    """One entry the sweep judged: ``path`` on ``node``, its ``kind`` (``placed``: a
    blob; ``placed-marker``: a dead writer's pending marker), its size, and what was
    done (``removed``, ``would remove``, ``kept: <why>``, ``failed: <error>``)."""

    node: str
    path: str
    kind: str
    nbytes: int
    action: str


def needs_names(scans: list[HolderScan], dead: set[Process]) -> bool:
    """Whether any blob lacks a live writer's marker (only then are stubs listed)."""
    return any(not _live(scan, blob, dead) for scan in scans for blob in scan.blobs) or any(
        p in dead for scan in scans for ms in scan.markers.values() for _, p in ms
    )


def judge(scan: HolderScan, dead: set[Process], named: frozenset[str]) -> list[Swept]:
    """What to do with each entry of ``scan``: ``would remove`` a blob no live writer
    declared and no name in ``named`` (``<dir>/<blob>`` of every stub) names, and a
    dead writer's marker (after its blob); ``kept`` a live writer's blob. Named
    blobs are the storage's data: not listed."""
    out = []
    for blob, size in sorted(scan.blobs.items()):
        path = f"{scan.root}/{scan.dir}/{blob}"
        live = _live(scan, blob, dead)
        if live:
            who = live[0]
            why = f"kept: its writer (on node {who.node_id[:12]}) is alive and may still name it"
            out.append(Swept(scan.node, path, "placed", size, why))
        elif f"{scan.dir}/{blob}" not in named:
            out.append(Swept(scan.node, path, "placed", size, "would remove"))
    for _, markers in sorted(scan.markers.items()):
        for name, writer in markers:
            if writer in dead:
                path = f"{scan.root}/{scan.dir}/{name}"
                out.append(Swept(scan.node, path, "placed-marker", 0, "would remove"))
    return out


def _live(scan: HolderScan, blob: str, dead: set[Process]) -> list[Process]:
    return [p for _, p in scan.markers.get(blob, ()) if p not in dead]
