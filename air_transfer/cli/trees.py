"""The files of a tree on any pyarrow filesystem, and each file's chunk checksums
read back through it: what ``verify`` checks and ``cp`` compares. Plain pyarrow.

A file is cut every ``chunk_bytes`` from its start, as the durable tier's records
and incremental node storage cut it, so sums taken here compare with theirs.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow.fs as pafs

from air_transfer.core.checksum import chunk_hasher
from air_transfer.core.fs_listing import list_below
from air_transfer.core.internal_names import is_internal

#: Chunk size of the sums a command takes (the library's default chunk).
CHUNK_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Tree:
    """What is at a path: ``files`` (path relative to it -> size; ``{"": size}`` when
    the path is a file) and ``dirs`` (relative paths of its directories)."""

    files: dict[str, int]
    dirs: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return sum(self.files.values())


@dataclass(frozen=True)
class FileSums:
    """A file's size and the checksum of each of its chunks."""

    size: int
    chunk_bytes: int
    sums: tuple[str, ...]


def tree_at(fs: pafs.FileSystem, path: str) -> Tree:
    """The tree at ``path`` of ``fs``; FileNotFoundError naming it if nothing is there.
    Names the library keeps for itself (staging, uploads in flight) are left out."""
    [info] = fs.get_file_info([path])
    if info.type == pafs.FileType.File:
        return Tree({"": int(info.size)}, ())
    if info.type != pafs.FileType.Directory:
        raise FileNotFoundError(f"nothing at {path}")
    files: dict[str, int] = {}
    dirs = []
    for rel, entry in list_below(fs, path):
        if any(is_internal(part) for part in rel.split("/")):
            continue
        if entry.type == pafs.FileType.File:
            files[rel] = int(entry.size)
        elif entry.type == pafs.FileType.Directory:
            dirs.append(rel)
    return Tree(dict(sorted(files.items())), tuple(sorted(dirs)))


def join(path: str, rel: str) -> str:
    """``path`` and a relative path of its tree ("" is ``path`` itself)."""
    return posixpath.join(path, rel) if rel else path


def relative_to(root: str, path: str) -> str:
    """``path`` (at or under ``root``) relative to ``root``; "" for the root itself."""
    rel = posixpath.relpath(path, root)
    return "" if rel == "." else rel


def read_sums(
    fs: pafs.FileSystem,
    path: str,
    chunk_bytes: int = CHUNK_BYTES,
    progress: Callable[[int], None] | None = None,
    sink: Callable[[memoryview], None] | None = None,
) -> FileSums:
    """Read the file ``path`` of ``fs`` whole and checksum each of its chunks; each
    piece read goes to ``sink`` too (``cp`` writes it) before ``progress`` counts it."""
    sums = []
    hasher, in_chunk, size = chunk_hasher(), 0, 0
    with fs.open_input_stream(path) as f:
        while True:
            data = memoryview(f.read(chunk_bytes)).cast("B")
            if not data:
                break
            if sink is not None:
                sink(data)
            size += len(data)
            if progress is not None:
                progress(len(data))
            while data:
                take = min(chunk_bytes - in_chunk, len(data))
                hasher.update(data[:take])
                in_chunk += take
                data = data[take:]
                if in_chunk == chunk_bytes:
                    sums.append(hasher.hexdigest())
                    hasher, in_chunk = chunk_hasher(), 0
    if in_chunk:
        sums.append(hasher.hexdigest())
    return FileSums(size, chunk_bytes, tuple(sums))
