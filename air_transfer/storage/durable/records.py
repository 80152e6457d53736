"""What the drain stores beside each file in the durable tier, so that a reader there
verifies every byte it reads: the file's size, mode and mtime and a checksum per
chunk, cut every ``chunk_bytes`` from the file's start (as incremental node storage
cuts them, so a byte range is checked by the chunks it falls in).

A record lives at ``base/.air-transfer/files/<path>.json`` and is written after its
file, so a record never describes bytes that are not there yet; a file without a
record (written there by someone else) is read unverified beyond its size. The
drain also keeps every record in one ``index.json`` (what a drain taking over
starts from). Data with a schema version: an unknown version is an error, never
guessed at.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs
import xxhash

from air_transfer.core.checksum import chunk_checksum
from air_transfer.storage.durable.target import META_DIR, DurableTarget

SCHEMA_VERSION = 1
FILES_DIR = f"{META_DIR}/files"
INDEX = f"{META_DIR}/index.json"


@dataclass(frozen=True)
class FileRecord:
    """One file as the durable tier holds it."""

    size: int
    mtime_ns: int
    mode: int
    chunk_bytes: int
    #: xxh3-128 of each chunk, cut every ``chunk_bytes`` from offset 0.
    sums: tuple[str, ...]

    @property
    def digest(self) -> str:
        """The file's content identity: equal digests, equal bytes."""
        return xxhash.xxh3_128_hexdigest(f"{self.size}:{','.join(self.sums)}".encode())

    def chunk_length(self, index: int) -> int:
        return min(self.chunk_bytes, self.size - index * self.chunk_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "mode": self.mode,
            "chunk_bytes": self.chunk_bytes,
            "sums": list(self.sums),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FileRecord:
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"a durable-tier file record of schema version {version!r}; this "
                f"air-transfer reads version {SCHEMA_VERSION} (upgrade it to read this tier)"
            )
        record = cls(
            int(d["size"]),
            int(d["mtime_ns"]),
            int(d["mode"]),
            int(d["chunk_bytes"]),
            tuple(str(s) for s in d["sums"]),
        )
        expected = -(-record.size // record.chunk_bytes) if record.chunk_bytes > 0 else -1
        if expected != len(record.sums):
            raise ValueError(
                f"a durable-tier file record of {record.size} bytes holds "
                f"{len(record.sums)} chunk checksums, not {expected}"
            )
        return record


def record_path(target: DurableTarget, rel: str) -> str:
    return target.path(f"{FILES_DIR}/{rel}.json")


def read_record(target: DurableTarget, rel: str) -> FileRecord | None:
    """The record of ``rel``, or None where there is none."""
    try:
        with target.filesystem.open_input_stream(record_path(target, rel)) as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return FileRecord.from_dict(json.loads(data))


def write_record(target: DurableTarget, rel: str, record: FileRecord) -> None:
    put_whole(target, record_path(target, rel), json.dumps(record.to_dict()).encode())


def delete_record(target: DurableTarget, rel: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        target.filesystem.delete_file(record_path(target, rel))


def read_index(target: DurableTarget) -> dict[str, FileRecord]:
    """Every record the last drain saved in the index (empty if none)."""
    try:
        with target.filesystem.open_input_stream(target.path(INDEX)) as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return {}
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"the durable tier {target.uri} has an index of schema version "
            f"{data.get('schema_version')!r}; this air-transfer reads {SCHEMA_VERSION}"
        )
    return {rel: FileRecord.from_dict(d) for rel, d in data["files"].items()}


def write_index(target: DurableTarget, records: dict[str, FileRecord]) -> None:
    doc = {
        "schema_version": SCHEMA_VERSION,
        "files": {rel: r.to_dict() for rel, r in sorted(records.items())},
    }
    put_whole(target, target.path(INDEX), json.dumps(doc).encode())


def put_whole(target: DurableTarget, path: str, data: bytes) -> None:
    """Write ``data`` at ``path`` so that it appears whole or not at all: in place on
    an object store, else under a temporary name moved into place."""
    fs = target.filesystem
    parent = path.rsplit("/", 1)[0]
    if target.atomic_writes:
        with fs.open_output_stream(path) as out:
            out.write(data)
        return
    fs.create_dir(parent, recursive=True)
    staged = target.staged(target.rel(path))
    try:
        with fs.open_output_stream(staged) as out:
            out.write(data)
        fs.move(staged, path)
    except BaseException:
        _discard(fs, staged)
        raise


def _discard(fs: pafs.FileSystem, path: str) -> None:
    with contextlib.suppress(OSError):
        fs.delete_file(path)


def file_sums(fd: int, size: int, chunk_bytes: int) -> Iterator[str]:
    """The checksum of each chunk of the open file ``fd`` of ``size`` bytes."""
    offset = 0
    while offset < size:
        n = min(chunk_bytes, size - offset)
        data = os.pread(fd, n, offset)
        if len(data) != n:
            raise OSError(f"read {len(data)} of {n} bytes at offset {offset}: the file shrank")
        yield chunk_checksum(data)
        offset += n
