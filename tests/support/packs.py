"""A directory packed into chunks in this process (no Ray, no agent), for the tests
of the writer: what a transfer would deliver, and a check that no staging is left."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs

from air_transfer.config import MIN_CHUNK_BYTES
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.manifest import Manifest
from air_transfer.core.proven_read import read_chunks
from air_transfer.core.scan import Source, scan


def local_pack(root: Path, chunk_bytes: int = MIN_CHUNK_BYTES) -> tuple[Manifest, list[bytes]]:
    """The manifest and the chunks of the directory ``root``."""
    source = Source(pafs.LocalFileSystem(), str(root))
    scanned = scan(source)
    chunks = [
        bytes(v)
        for _, v in read_chunks(
            source,
            scanned.files,
            scanned.stamps,
            chunk_bytes,
            lambda i, n: memoryview(bytearray(n)),
        )
    ]
    return Manifest(scanned.entries, chunk_bytes, tuple(map(chunk_checksum, chunks))), chunks


def no_staging_left(parent: Path) -> bool:
    """Whether ``parent`` holds no staging directory of a writer."""
    return not [p for p in os.listdir(parent) if ".air-staging-" in p]
