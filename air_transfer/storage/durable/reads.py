"""Reading the durable tier by its manifests (``records``), never by a listing: what a
path is, what a directory holds (less what a pending delete took), whether a
checkpoint is whole there, and a file's bytes, each chunk verified.

``TierReads`` caches the manifests it read (a few seconds; the drain's own writes
replace them at once). An endpoint that does not answer is asked again for at most
``wait_s`` seconds, answering from a manifest read before if it has one, then
``TierUnreachable`` says so: a path node storage does not hold is answered by the
tier alone, and a reader must not take "no answer" for "not there" (a restart would
start from scratch beside a run the tier holds).

A file is read in whole chunks of its record, one ranged read each, decoded by its
codec and checked against the chunk's checksum before a byte of it is returned
(``ChecksumError`` otherwise, naming the file and the chunk).
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow.fs as pafs

from air_transfer.cluster.agent_client import Info, Listed
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.reader import ChunkFileReader
from air_transfer.core.threads import pool
from air_transfer.errors import ChecksumError
from air_transfer.storage.durable.codecs import decode
from air_transfer.storage.durable.objects import TierObjects
from air_transfer.storage.durable.records import (
    DirManifest,
    FileRecord,
    manifest_path,
    parent_and_name,
)
from air_transfer.storage.durable.target import META_DIR, DurableTarget, is_staged
from air_transfer.storage.durable.tombstones import covered

NOT_FOUND: Info = (pafs.FileType.NotFound, None, None)
DIRECTORY: Info = (pafs.FileType.Directory, None, None)
_counted = threading.Lock()
_bytes_read = 0


def bytes_read() -> int:
    """Bytes this process has read from durable tiers' files so far (each chunk read
    counted once): what a restore that reads through cost."""
    return _bytes_read


class TierUnreachable(ConnectionError):
    """The durable tier did not answer within the wait, and only it can answer."""


class TierDamaged(ChecksumError):
    """The durable tier lacks what its own manifests name."""


def hidden(rel: str) -> bool:
    """Whether ``rel`` is one of the tier's own names (records, staged uploads)."""
    return (
        rel == META_DIR
        or rel.startswith(META_DIR + "/")
        or any(is_staged(part) for part in rel.split("/"))
    )


@dataclass(frozen=True)
class Whole:
    """Whether a path is whole in the tier, and if not, the first thing wrong."""

    whole: bool
    why: str = ""


class TierReads:
    """The manifests of tier ``target``, read on demand and kept ``ttl_s`` seconds."""

    def __init__(self, target: DurableTarget, wait_s: float = 30.0, ttl_s: float = 5.0) -> None:
        self.target, self.wait_s, self.ttl_s = target, wait_s, ttl_s
        self.objects = TierObjects(target)
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, DirManifest | None]] = {}
        self._written: dict[str, int] = {}  # how often the drain wrote each

    # -- manifests -----------------------------------------------------------------------
    def manifest(self, rel_dir: str, fresh: bool = False) -> DirManifest | None:
        """The manifest of directory ``rel_dir`` (None: the tier has none), read anew
        with ``fresh`` or once the cached one is ``ttl_s`` old."""
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(rel_dir)
            written = self._written.get(rel_dir, 0)
        if cached is not None and not fresh and now - cached[0] < self.ttl_s:
            return cached[1]
        path = manifest_path(self.target, rel_dir)
        try:
            found = self.objects.get(path)
        except OSError:
            if cached is not None:
                return cached[1]  # what it said before: better than no answer
            found = self._ask(lambda: self.objects.get(path))
        manifest = (
            None if found is None else DirManifest.from_bytes(found, rel_dir, self.target.uri)
        )
        with self._lock:
            if self._written.get(rel_dir, 0) != written:  # the drain wrote it meanwhile
                return self._cache[rel_dir][1]
            self._cache[rel_dir] = (time.monotonic(), manifest)
        return manifest

    def remember(self, rel_dir: str, manifest: DirManifest | None) -> None:
        """What the tier holds for ``rel_dir`` now (the drain wrote it): a read that
        was in flight meanwhile does not replace it."""
        with self._lock:
            self._cache[rel_dir] = (time.monotonic(), manifest)
            self._written[rel_dir] = self._written.get(rel_dir, 0) + 1

    def _ask(self, call: Callable[[], bytes | None]) -> bytes | None:
        """``call()``, asked again while the tier does not answer, ``wait_s`` at most."""
        deadline = time.monotonic() + self.wait_s
        delay = 0.1
        while True:
            try:
                return call()
            except FileNotFoundError:
                return None
            except OSError as e:
                if time.monotonic() + delay > deadline:
                    raise TierUnreachable(
                        errno.EHOSTUNREACH,
                        f"the durable tier {self.target.uri} did not answer for "
                        f"{self.wait_s:g} s ({type(e).__name__}: {e}); it alone holds what "
                        "node storage does not: check that its endpoint is up and reachable",
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def named_manifest(self, rel_dir: str) -> DirManifest | None:
        """The manifest of ``rel_dir``; None where the tier holds no such directory;
        ``TierDamaged`` where its parent's manifest names it but its own is missing
        (never taken for "not there": a restore would start from scratch)."""
        manifest = self.manifest(rel_dir)
        if manifest is not None or not rel_dir:
            return manifest
        parent, name = parent_and_name(rel_dir)
        above = self.named_manifest(parent)
        if above is None or name not in above.dirs:
            return None
        manifest = self.manifest(rel_dir, fresh=True)  # written since the first look?
        if manifest is None:
            raise TierDamaged(
                errno.EBADMSG,
                f"the durable tier {self.target.uri} names the directory but its manifest "
                "is missing (deleted or lost): what it held cannot be read or trusted",
                self.target.path(rel_dir),
            )
        return manifest

    # -- what a path is ----------------------------------------------------------------
    def record(self, rel: str) -> FileRecord | None:
        """The record of the file ``rel`` (None: the tier names no such file)."""
        if not rel or hidden(rel):
            return None
        parent, name = parent_and_name(rel)
        manifest = self.named_manifest(parent)
        return None if manifest is None else manifest.files.get(name)

    def info(self, rel: str, deleted: set[str]) -> Info:
        """What ``rel`` is in the tier, as a reader of node storage sees it."""
        if hidden(rel) or covered(rel, deleted):
            return NOT_FOUND
        if not rel:
            return DIRECTORY if self.manifest("") is not None else NOT_FOUND
        parent, name = parent_and_name(rel)
        manifest = self.named_manifest(parent)
        if manifest is None:
            return NOT_FOUND
        record = manifest.files.get(name)
        if record is not None:
            return (pafs.FileType.File, record.size, record.mtime_ns)
        return DIRECTORY if name in manifest.dirs else NOT_FOUND

    def listing(self, base: str, recursive: bool, deleted: set[str]) -> list[Listed] | None:
        """``(path relative to base, type, size, mtime_ns)`` under ``base`` as its
        manifests name them, less what a pending delete covers; None if the tier
        holds no directory ``base``."""
        if covered(base, deleted) or hidden(base):
            return None
        top = self.named_manifest(base)
        if top is None:
            return None
        out: list[Listed] = []
        pending = [("", top)]
        while pending:
            inner, manifest = pending.pop()
            for name, record in manifest.files.items():
                rel = _join(inner, name)
                if not covered(_join(base, rel), deleted):
                    out.append((rel, pafs.FileType.File, record.size, record.mtime_ns))
            for name in manifest.dirs:
                rel = _join(inner, name)
                if covered(_join(base, rel), deleted):
                    continue
                out.append((rel, pafs.FileType.Directory, None, None))
                if recursive:
                    below = self.named_manifest(_join(base, rel))
                    if below is not None:
                        pending.append((rel, below))
        return sorted(out)

    def whole(self, rel: str) -> Whole:
        """Whether everything the manifests name at and under ``rel`` is in the tier
        now: each subdirectory's manifest, each object of its recorded size and
        version (a HEAD each, several at a time)."""
        files: list[tuple[str, FileRecord]] = []
        try:
            record = self.record(rel)
        except TierDamaged as e:
            return Whole(False, str(e))
        if record is not None:
            files.append((rel, record))
        else:
            parent, name = parent_and_name(rel)
            if rel and (m := self.manifest(parent)) is not None and name not in m.dirs:
                return Whole(False, f"{self.target.path(rel)} is not in its directory's manifest")
            dirs = [rel]
            while dirs:
                at = dirs.pop()
                manifest = self.manifest(at)
                if manifest is None:
                    return Whole(False, f"the manifest of {self.target.path(at)} is missing")
                files += [(_join(at, n), r) for n, r in manifest.files.items()]
                dirs += [_join(at, n) for n in manifest.dirs]
        with pool("air-transfer-tier-heads", 16) as heads:
            problems = list(heads.map(self._problem, files))
        wrong = [p for p in problems if p]
        return Whole(False, wrong[0]) if wrong else Whole(True)

    def _problem(self, item: tuple[str, FileRecord]) -> str:
        rel, record = item
        path = self.target.path(rel)
        found = self.objects.head(path)
        if found is None:
            return f"{path} is missing"
        if found.size != record.stored_size:
            return f"{path} holds {found.size} bytes, its manifest says {record.stored_size}"
        if record.tag and found.tag != record.tag:
            return f"{path} was replaced since the drain confirmed it (version {found.tag})"
        return ""


def open_verified(target: DurableTarget, rel: str, record: FileRecord) -> ChunkFileReader:
    """A seekable stream over the durable tier's file ``rel`` as ``record`` (its
    manifest's) describes it, each chunk decoded and checked against it."""
    path = target.path(rel)
    try:
        source = target.filesystem.open_input_file(path)
    except FileNotFoundError:
        raise TierDamaged(
            errno.ENOENT,
            f"the durable tier's manifest names this file ({record.size} bytes) but the "
            "tier does not hold it (deleted or lost)",
            path,
        ) from None

    def chunks(first: int, _last: int) -> Iterator[tuple[int, memoryview]]:
        index = first
        while index * record.chunk_bytes < record.size:
            yield index, _chunk(path, source, record, index)
            index += 1

    return ChunkFileReader(path, record.size, 0, record.chunk_bytes, chunks)


def _chunk(path: str, source: pafs.NativeFile, record: FileRecord, index: int) -> memoryview:
    offset, length = record.stored_range(index)
    expected = record.chunk_length(index)
    stored = memoryview(source.read_at(length, offset)).cast("B")
    global _bytes_read
    with _counted:
        _bytes_read += len(stored)
    problem = ""
    data = stored
    if len(stored) != length:
        problem = f"{len(stored)} bytes at offset {offset} of the object, expected {length}"
    else:
        try:
            data = memoryview(decode(record.codec, stored, expected)).cast("B")
        except ValueError as e:
            problem = f"it does not decode ({e})"
    if not problem and (len(data) != expected or chunk_checksum(data) != record.sums[index]):
        problem = "its bytes do not match the checksum the drain recorded"
    if problem:
        raise ChecksumError(
            errno.EBADMSG,
            f"chunk {index} of the durable tier's file: {problem}; nothing of it was returned",
            path,
        )
    return data


def _join(a: str, b: str) -> str:
    return f"{a}/{b}" if a else b
