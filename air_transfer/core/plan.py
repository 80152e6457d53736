"""Where every byte of a checkpoint's stream goes: the files laid end to end, cut
every ``chunk_bytes``. One span type serves both ends: the packer reads a chunk's
spans from the files a ``ChunkPlan`` names, the writer cuts a chunk back into files.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from air_transfer.core.entry import Entry
from air_transfer.core.scan import Stamp


class Span(NamedTuple):
    """``length`` bytes of file number ``file_index`` (in stream order), starting at
    ``file_offset`` in that file, found at ``chunk_offset`` in their chunk. (A
    NamedTuple: one is made per file per chunk, cheaply.)"""

    file_index: int
    file_offset: int
    length: int
    chunk_offset: int


@dataclass(frozen=True)
class ChunkPlan:
    """Chunk ``index``: ``length`` bytes made of ``spans``, and for each span the
    file it reads (path relative to the source root) with the ``Stamp`` the read must
    prove unchanged. Small and picklable, so a chunk can be filled in another process
    from its plan and the source alone."""

    index: int
    length: int
    spans: tuple[Span, ...]
    files: tuple[tuple[str, Stamp], ...]


def chunk_count(total_bytes: int, chunk_bytes: int) -> int:
    return -(-total_bytes // chunk_bytes)


def iter_chunk_spans(
    file_sizes: Sequence[int], chunk_bytes: int, start_chunk: int = 0
) -> Iterator[list[Span]]:
    """Yield, for each chunk from ``start_chunk`` on, the file spans it carries.

    Empty files carry no span. Lazy, so a million chunks never materialise at once.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    total = sum(file_sizes)
    n_chunks = chunk_count(total, chunk_bytes)
    file_index, file_start = 0, 0  # file_start: stream offset of file_index
    for chunk in range(start_chunk, n_chunks):
        lo = chunk * chunk_bytes
        hi = min(lo + chunk_bytes, total)
        while file_start + file_sizes[file_index] <= lo:
            file_start += file_sizes[file_index]
            file_index += 1
        spans: list[Span] = []
        pos, i, fstart = lo, file_index, file_start
        while pos < hi:
            size = file_sizes[i]
            take = min(fstart + size, hi) - pos
            if take > 0:
                spans.append(Span(i, pos - fstart, take, pos - lo))
                pos += take
            fstart += size
            i += 1
        yield spans


def plan_chunks(
    files: Sequence[Entry],
    stamps: Sequence[Stamp],
    chunk_bytes: int,
    start_chunk: int = 0,
    stop_chunk: int | None = None,
) -> Iterator[ChunkPlan]:
    """The plans of chunks ``start_chunk``..``stop_chunk - 1`` (default: to the end)
    of the stream of ``files``, whose scan stamps are ``stamps``. Lazy."""
    if len(stamps) != len(files):
        raise ValueError(f"{len(stamps)} stamps for {len(files)} files")
    sizes = [f.size for f in files]
    for f, s in zip(files, stamps, strict=True):
        if s.size != f.size:
            raise ValueError(f"stamp of {f.path!r} says {s.size} bytes, the entry {f.size}")
    total = sum(sizes)
    for index, spans in enumerate(iter_chunk_spans(sizes, chunk_bytes, start_chunk), start_chunk):
        if stop_chunk is not None and index >= stop_chunk:
            return
        yield ChunkPlan(
            index,
            min(chunk_bytes, total - index * chunk_bytes),
            tuple(spans),
            tuple((files[s.file_index].path, stamps[s.file_index]) for s in spans),
        )
