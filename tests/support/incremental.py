"""What the incremental node-storage tests share: checkpoint directories of
same-size files changed in known ways, the sender's description of one taken as
its node's agent takes it (proven reads, a checksum per per-file chunk), and a
store of one through ``IncrementalStore`` on this machine."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.file_chunks import ChunkedFiles, file_chunk_plans
from air_transfer.core.manifest import Manifest
from air_transfer.core.proven_read import fill_chunk
from air_transfer.core.scan import Source, scan
from air_transfer.storage.server.incremental import IncrementalStore
from air_transfer.storage.server.senders import local_chunks

CHUNK = 64 * 1024
FILES = 10
PER_FILE = 4  # chunks per file: 10 files of 256 KiB, 2.5 MiB in all
FILE_BYTES = PER_FILE * CHUNK
TOTAL = FILES * FILE_BYTES


def make_files(directory: Path, names: list[str] | None = None) -> Path:
    """``FILES`` random files of ``FILE_BYTES`` (``f0``..), one in a subdirectory."""
    (directory / "sub").mkdir(parents=True, exist_ok=True)
    for name in names or [f"f{i}" if i else "sub/f0" for i in range(FILES)]:
        (directory / name).write_bytes(os.urandom(FILE_BYTES))
    (directory / "empty").write_bytes(b"")
    return directory


def rewrite_chunk(path: Path, chunk: int) -> None:
    """Change chunk ``chunk`` of ``path`` in place (same size)."""
    with open(path, "r+b") as f:
        f.seek(chunk * CHUNK)
        f.write(os.urandom(CHUNK))


def describe(directory: Path, chunk_bytes: int = CHUNK) -> tuple[Source, ChunkedFiles]:
    """``directory`` as its sender describes it before sending anything."""
    source = Source(pafs.LocalFileSystem(), str(directory))
    scanned = scan(source)
    sums = []
    for plan in file_chunk_plans(scanned.files, scanned.stamps, chunk_bytes):
        view = memoryview(np.empty(plan.length, dtype=np.uint8))
        fill_chunk(source, plan, view)
        sums.append(chunk_checksum(view))
    manifest = Manifest(scanned.entries, chunk_bytes, None)
    return source, ChunkedFiles(manifest, scanned.stamps, tuple(sums))


def store(
    incremental: IncrementalStore, root: Path, target: Path, directory: Path
) -> dict[str, int]:
    """Store ``directory`` at ``target`` under ``root`` from this node's disk."""
    source, files = describe(directory)
    return incremental.store(
        str(root), str(target), files, lambda plans: local_chunks(source, plans)
    )


def inodes(*trees: Path) -> dict[int, int]:
    """inode -> bytes on disk, over every file of ``trees`` (each inode once)."""
    found: dict[int, int] = {}
    for tree in trees:
        for path in tree.rglob("*"):
            st = path.lstat()
            if path.is_file():
                found[st.st_ino] = st.st_blocks * 512
    return found
