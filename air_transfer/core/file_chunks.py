"""Per-file chunks: every file cut on its own every ``chunk_bytes`` from its offset 0.

Incremental node storage compares a new checkpoint with the ones stored before it
chunk by chunk, so a chunk must have the same bytes (and checksum) in both whatever
changed elsewhere: in the transfer's one stream, a file that grows by a byte shifts
every chunk after it. Cut per file, a chunk of an unchanged file, or an unchanged
region of a file changed in place, is the same chunk in every checkpoint, under any
name (why not content-defined boundaries: ``docs/design.md``, "Incremental node
storage"). ``ChunkedFiles`` is what the sender sends first: the entries, each file's
scan stamp (for the proven reads of what is then sent) and the checksum of each
per-file chunk. Plain Python.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from air_transfer.core.checksum import is_checksum
from air_transfer.core.entry import Entry
from air_transfer.core.manifest import Manifest
from air_transfer.core.plan import ChunkPlan, Span
from air_transfer.core.scan import Stamp
from air_transfer.errors import ManifestError


def chunks_of(size: int, chunk_bytes: int) -> int:
    """How many per-file chunks a file of ``size`` bytes has (none when empty)."""
    return -(-size // chunk_bytes)


def file_chunk_plans(
    files: Sequence[Entry], stamps: Sequence[Stamp], chunk_bytes: int
) -> Iterator[ChunkPlan]:
    """The plan of every per-file chunk, files in order, numbered from 0 across all
    files: one span each, read from its file as ``stamps`` say it was scanned."""
    if len(files) != len(stamps):
        raise ValueError(f"{len(stamps)} stamps for {len(files)} files")
    index = 0
    for i, (f, stamp) in enumerate(zip(files, stamps, strict=True)):
        for offset in range(0, f.size, chunk_bytes):
            length = min(chunk_bytes, f.size - offset)
            yield ChunkPlan(index, length, (Span(i, offset, length, 0),), ((f.path, stamp),))
            index += 1


@dataclass(frozen=True)
class ChunkedFiles:
    """A checkpoint as the sender describes it before sending any byte: ``manifest``
    (entries and ``chunk_bytes``; its stream checksums unused), the scan ``stamps``
    of its files (stream order) and ``checksums``, one per per-file chunk
    (``file_chunk_plans`` order). Validated at construction, so also on arrival
    (the manifest validates itself when unpickled)."""

    manifest: Manifest
    stamps: tuple[Stamp, ...]
    checksums: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "stamps", tuple(Stamp(*s) for s in self.stamps))
        object.__setattr__(self, "checksums", tuple(self.checksums))
        files = list(self.manifest.files())
        if len(self.stamps) != len(files):
            raise ManifestError(f"{len(self.stamps)} stamps for {len(files)} files")
        for f, s in zip(files, self.stamps, strict=True):
            if s.size != f.size:
                raise ManifestError(f"stamp of {f.path!r} says {s.size} bytes, entry {f.size}")
        wanted = sum(chunks_of(f.size, self.manifest.chunk_bytes) for f in files)
        if len(self.checksums) != wanted:
            raise ManifestError(
                f"{len(self.checksums)} chunk checksums for files that have {wanted} chunks"
            )
        bad = next((c for c in self.checksums if not is_checksum(c)), None)
        if bad is not None:
            raise ManifestError(f"not a chunk checksum: {bad!r}")

    @property
    def chunk_bytes(self) -> int:
        return self.manifest.chunk_bytes

    def files(self) -> Iterator[tuple[Entry, int, tuple[str, ...]]]:
        """Each file with the index of its first chunk and its chunks' checksums."""
        first = 0
        for f in self.manifest.files():
            count = chunks_of(f.size, self.chunk_bytes)
            yield f, first, self.checksums[first : first + count]
            first += count

    def plans(self) -> list[ChunkPlan]:
        """The plan of every chunk (to read one from the sender's directory)."""
        return list(file_chunk_plans(list(self.manifest.files()), self.stamps, self.chunk_bytes))
