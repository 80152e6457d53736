"""The durable tier's truth: one manifest per directory, naming every file in it (its
size, mode, mtime, how its bytes are stored and a checksum per chunk) and every
subdirectory, written after what it names.

A reader goes by the manifests, never by a listing of the bucket: a file exists in the
tier when its directory's manifest names it, and every byte read is checked against
the chunk checksums there. So an object that went missing, was cut short or replaced
is an error naming the file, not a file that silently is not there or holds other
bytes. A checkpoint directory is complete when its manifest is there: the drain
writes it once every file it names is confirmed in the tier, and each subdirectory's
manifest before its parent's.

A manifest lives at ``base/.air-transfer/dirs/<hash of its path>.json`` (a flat name
that no path of node storage can collide with) and holds its own path. Data with a
schema version: an unknown version, kind or codec is an error, never guessed at.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import xxhash

from air_transfer.core.checksum import is_checksum
from air_transfer.storage.durable.target import META_DIR, DurableTarget

SCHEMA_VERSION = 2
DIRS_DIR = f"{META_DIR}/dirs"
#: The codec of a file stored as it is (``FileRecord.codec``).
IDENTITY = "identity"


@dataclass(frozen=True)
class FileRecord:
    """One file as the durable tier holds it: ``size`` bytes whose chunks of
    ``chunk_bytes`` (cut from offset 0) have checksums ``sums`` (xxh3-128 of the
    file's own bytes); stored by ``codec``, chunk ``i`` taking ``stored[i]`` bytes of
    the object (None: stored as they are, the object is the file); ``tag``: the
    tier's version of the object when the drain confirmed it (an S3 ETag, a size and
    mtime elsewhere), which changes when anything replaces it."""

    size: int
    mtime_ns: int
    mode: int
    chunk_bytes: int
    sums: tuple[str, ...]
    codec: str = IDENTITY
    stored: tuple[int, ...] | None = None
    tag: str = ""

    @property
    def digest(self) -> str:
        """The file's content identity: equal digests, equal bytes."""
        return content_digest(self.size, self.sums)

    @property
    def stored_size(self) -> int:
        """The object's size in the tier."""
        return self.size if self.stored is None else sum(self.stored)

    def chunk_length(self, index: int) -> int:
        return min(self.chunk_bytes, self.size - index * self.chunk_bytes)

    def stored_range(self, index: int) -> tuple[int, int]:
        """``(offset, length)`` of chunk ``index`` in the object."""
        if self.stored is None:
            return index * self.chunk_bytes, self.chunk_length(index)
        return sum(self.stored[:index]), self.stored[index]

    def confirmed(self, tag: str) -> FileRecord:
        return replace(self, tag=tag)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "mode": self.mode,
            "chunk_bytes": self.chunk_bytes,
            "sums": list(self.sums),
            "codec": self.codec,
            "tag": self.tag,
        }
        if self.stored is not None:
            out["stored"] = list(self.stored)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> FileRecord:
        try:
            stored = d.get("stored")
            record = cls(
                int(d["size"]),
                int(d["mtime_ns"]),
                int(d["mode"]),
                int(d["chunk_bytes"]),
                tuple(str(s) for s in d["sums"]),
                str(d.get("codec", IDENTITY)),
                None if stored is None else tuple(int(n) for n in stored),
                str(d.get("tag", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a malformed file record in the durable tier ({where}): {e!r}") from e
        expected = -(-record.size // record.chunk_bytes) if record.chunk_bytes > 0 else -1
        if record.size < 0 or expected != len(record.sums):
            raise ValueError(
                f"the durable tier's record of {where} ({record.size} bytes) holds "
                f"{len(record.sums)} chunk checksums, not {expected}"
            )
        if not all(is_checksum(s) for s in record.sums):
            raise ValueError(f"the durable tier's record of {where} holds a malformed checksum")
        if record.stored is not None and len(record.stored) != len(record.sums):
            raise ValueError(
                f"the durable tier's record of {where} stores {len(record.stored)} chunks, "
                f"not {len(record.sums)}"
            )
        return record


@dataclass(frozen=True)
class DirManifest:
    """One directory of the tier: ``files`` by name, and the names of its ``dirs``."""

    path: str
    files: Mapping[str, FileRecord] = field(default_factory=dict)
    dirs: frozenset[str] = frozenset()

    def to_bytes(self) -> bytes:
        doc = {
            "schema_version": SCHEMA_VERSION,
            "kind": "directory",
            "path": self.path,
            "files": {name: r.to_dict() for name, r in sorted(self.files.items())},
            "dirs": sorted(self.dirs),
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, path: str, uri: str) -> DirManifest:
        """The manifest of directory ``path`` read from tier ``uri``; ValueError if it
        is not one this version reads, or names another directory."""
        where = f"{uri}: the manifest of {path or '(the base)'!r}"
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise ValueError(f"{where} is not JSON: {e}") from e
        if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
            version = doc.get("schema_version") if isinstance(doc, dict) else None
            raise ValueError(
                f"{where} is of schema version {version!r}; this air-transfer reads "
                f"version {SCHEMA_VERSION} (upgrade it to read this tier)"
            )
        if doc.get("kind") != "directory" or doc.get("path") != path:
            raise ValueError(f"{where} describes {doc.get('kind')!r} {doc.get('path')!r}")
        files = {
            str(name): FileRecord.from_dict(d, f"{path}/{name}" if path else str(name))
            for name, d in doc.get("files", {}).items()
        }
        dirs = frozenset(str(d) for d in doc.get("dirs", []))
        for name in (*files, *dirs):
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"{where} names {name!r}, not a name")
        return cls(path, files, dirs)


def content_digest(size: int, sums: tuple[str, ...]) -> str:
    """A file's content identity from its size and chunk checksums."""
    return xxhash.xxh3_128_hexdigest(f"{size}:{','.join(sums)}".encode())


def manifest_path(target: DurableTarget, rel_dir: str) -> str:
    """Where the manifest of directory ``rel_dir`` ("" for the base) lives."""
    name = hashlib.sha256(rel_dir.encode()).hexdigest()[:40]
    return target.path(f"{DIRS_DIR}/{name}.json")


def child(rel_dir: str, name: str) -> str:
    """The relative path of ``name`` in the directory ``rel_dir`` ("": the root)."""
    return f"{rel_dir}/{name}" if rel_dir else name


def parent_and_name(rel: str) -> tuple[str, str]:
    """``("a/b", "c")`` for ``"a/b/c"``; ``("", "c")`` for ``"c"``."""
    parent, _, name = rel.rpartition("/")
    return parent, name
